"""Which LoRA adapter an engine serves, for the adapters of engines that load LoRA by name.

SGLang and vLLM keep adapters by name beside the base weights: a new LoRA snapshot is
loaded under its identity, then the adapter it replaces is unloaded (a failed unload
only costs memory, so it is logged, not raised); a Full or Incremental load leaves no
adapter to route to. Requests name :attr:`LoraSlot.active` (each engine its own field).
The adapters differ only in the unload route; the bookkeeping lives here once.
"""

from __future__ import annotations

import logging

from hotload.engines.admin_http import AdminHttp

log = logging.getLogger(__name__)


class LoraSlot:
    """The one adapter name requests are routed to, and unloading the one it replaced."""

    def __init__(self, http: AdminHttp, *, engine: str, unload_path: str) -> None:
        self._http = http
        self._engine = engine
        self._unload_path = unload_path
        self.active: str | None = None
        """The adapter name requests are routed to; None while base weights are served."""

    async def replace(self, name: str) -> None:
        """Route to ``name`` (just loaded) and unload the adapter it replaces, if another."""
        previous, self.active = self.active, name
        if previous is not None and previous != name:
            await self._unload(previous)

    async def clear(self) -> None:
        """Base weights were loaded: route to no adapter and unload the one served."""
        if self.active is not None:
            previous, self.active = self.active, None
            await self._unload(previous)

    async def _unload(self, name: str) -> None:
        response = await self._http.request("POST", self._unload_path, json={"lora_name": name})
        if response.status_code != 200:
            log.warning(
                f"{self._engine} did not unload an old LoRA adapter",
                extra={"lora_name": name, "status": response.status_code},
            )
