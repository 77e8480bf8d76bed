"""Which LoRA adapter an engine serves, for the adapters of engines that load LoRA by name.

SGLang and vLLM keep adapters by name beside the base weights and bind each request to
one when it is admitted: a new LoRA snapshot is loaded under its identity, named as the
engine's version, and only then is the adapter it replaces unloaded. An unload may wait
(SGLang's waits for every request using the adapter) and its failure only costs memory,
so it is bounded, logged and never raised. A Full or Incremental load leaves no adapter
to route to. Requests name :attr:`LoraSlot.active` (each engine its own field). Which
adapter is served survives a sidecar restart only in the engine: both list loaded
adapters in ``GET /v1/models`` with the base model as ``parent`` (:meth:`LoraSlot.adopt`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hotload.engines.admin_http import AdminHttp, response_detail
from hotload.errors import HotloadError

log = logging.getLogger(__name__)

#: How long an unload may take before it is given up (the engine may go on with it).
UNLOAD_TIMEOUT_S = 30.0


class LoraSlot:
    """The one adapter name requests are routed to, and unloading the ones it replaced."""

    def __init__(self, http: AdminHttp, *, engine: str, unload_path: str) -> None:
        self._http = http
        self._engine = engine
        self._unload_path = unload_path
        self.active: str | None = None
        """The adapter name requests are routed to; None while base weights are served."""

    def route(self, name: str | None) -> str | None:
        """Route requests to ``name`` (None: the base weights); the adapter it replaces,
        which the caller unloads (:meth:`unload`) once nothing new can reach it."""
        previous, self.active = self.active, name
        return previous if previous is not None and previous != name else None

    async def unload(self, name: str, *, timeout: float = UNLOAD_TIMEOUT_S) -> bool:
        """Unload ``name``; False (logged, never raised) when the engine refused or did
        not answer within ``timeout``."""
        try:
            response = await self._http.request(
                "POST", self._unload_path, json={"lora_name": name}, timeout=timeout
            )
        except HotloadError as err:
            log.warning(
                f"{self._engine} did not unload an old LoRA adapter in time",
                extra={"lora_name": name, "error": str(err), "timeout": timeout},
            )
            return False
        if response.status_code != 200:
            log.warning(
                f"{self._engine} did not unload an old LoRA adapter",
                extra={
                    "lora_name": name,
                    "status": response.status_code,
                    "engine_message": response_detail(response),
                },
            )
            return False
        return True

    def adopt(self, models: Mapping[str, Any], identity: str) -> bool:
        """Route to ``identity`` when ``/v1/models`` (its JSON) lists it as an adapter of
        the base model: what a restarted sidecar learns from the engine. True if adopted."""
        data = models.get("data")
        adapters = {
            str(entry.get("id"))
            for entry in (data if isinstance(data, list) else [])
            if isinstance(entry, dict) and entry.get("parent")
        }
        if identity not in adapters:
            return False
        if self.active != identity:
            log.info(
                f"{self._engine} serves a LoRA adapter; requests are routed to it",
                extra={"adapter": identity},
            )
        self.active = identity
        return True
