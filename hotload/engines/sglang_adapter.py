"""Adapter for SGLang 0.5.23 (requests as read from its source; see engine-facts.md).

- Full/Incremental: ``POST /update_weights_from_disk`` with ``model_path``,
  ``weight_version`` = identity, ``flush_cache: false`` (the cache policy is applied by
  :meth:`reset_cache`) and ``abort_all_requests: false``. Unpaused it waits for in-flight
  generations; paused (``in_place``) it applies at once.
  **Trap**: the answer can be ``success: false`` although the weights *did* change (the
  flush after the load was refused while requests ran). Whenever ``success`` is false we
  read ``GET /model_info``: if ``weight_version`` is already our identity the load took.
- LoRA: ``POST /load_lora_adapter {lora_name, lora_path, pinned}`` then unload the
  previous adapter and record the identity with ``POST /update_weight_version``; requests
  name the adapter in ``lora_path``. Needs ``--enable-lora``.
- Pause: ``POST /pause_generation {"mode": "in_place"}`` (JSON body required);
  ``POST /continue_generation``. ``PauseMode.WAIT`` sends nothing: an unpaused
  ``update_weights_from_disk`` already waits for in-flight requests.
- Cache: ``POST /flush_cache?timeout=S`` (waits up to S s for idle). The radix cache is
  shared by prefix, not by session, so ``none`` and ``new_session`` both keep it.
- Admin routes carry the admin key (or the API key) as a bearer token when given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.engines.admin_http import json_object, response_detail
from hotload.engines.http_adapter import HttpEngine
from hotload.engines.identity_fields import weight_versions
from hotload.engines.lora_slot import LoraSlot
from hotload.engines.protocol import PauseMode
from hotload.errors import EngineBusy, EngineRejected, EngineUnavailable

log = logging.getLogger(__name__)

DEFAULT_LOAD_TIMEOUT = 1800.0
DEFAULT_FLUSH_TIMEOUT = 30.0
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class SGLangEngine(HttpEngine):
    """Drives a running SGLang server over its HTTP admin API."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        *,
        api_key: str | None = None,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
    ) -> None:
        super().__init__(base_url, client, api_key=api_key)
        self._load_timeout = load_timeout
        self._flush_timeout = flush_timeout
        self._lora = LoraSlot(self._http, engine="SGLang", unload_path="/unload_lora_adapter")

    @property
    def kind(self) -> EngineKind:
        return EngineKind.SGLANG

    @property
    def active_lora(self) -> str | None:
        """The adapter name requests are routed to, if a LoRA snapshot is served."""
        return self._lora.active

    async def served_identity(self) -> str | None:
        response = await self._http.request("GET", "/model_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "SGLang /model_info failed", url=self.base_url, status=response.status_code
            )
        version = json_object(response).get("weight_version")
        return str(version) if version not in (None, "") else None

    async def load_weights(self, path: Path, identity: str, *, kind: SnapshotKind) -> None:
        if kind is SnapshotKind.LORA:
            await self._load_lora(path, identity)
            return
        response = await self._http.request(
            "POST",
            "/update_weights_from_disk",
            json={
                "model_path": str(path),
                "weight_version": identity,
                "flush_cache": False,
                "abort_all_requests": False,
            },
            timeout=self._load_timeout,
        )
        body = json_object(response)
        if response.status_code == 200 and body.get("success") is True:
            await self._lora.clear()
            return
        detail = str(body.get("message") or response_detail(response))
        if await self.served_identity() == identity:
            # The trap: the weights changed though the call reports failure (flush refused).
            log.warning(
                "SGLang reported a failed update but serves the new weights",
                extra={"identity": identity, "engine_message": detail},
            )
            await self._lora.clear()
            return
        raise EngineRejected(
            f"SGLang refused the weights: {detail}",
            url=self.base_url,
            identity=identity,
            path=str(path),
            status=response.status_code,
        )

    async def _load_lora(self, path: Path, identity: str) -> None:
        response = await self._http.request(
            "POST",
            "/load_lora_adapter",
            json={"lora_name": identity, "lora_path": str(path), "pinned": False},
            timeout=self._load_timeout,
        )
        body = json_object(response)
        if response.status_code != 200 or body.get("success") is False:
            raise EngineRejected(
                f"SGLang refused the LoRA adapter: {response_detail(response)}",
                url=self.base_url,
                identity=identity,
                path=str(path),
                status=response.status_code,
            )
        await self._lora.replace(identity)
        await self._set_version(identity)

    async def _set_version(self, identity: str) -> None:
        response = await self._http.request(
            "POST",
            "/update_weight_version",
            json={"new_version": identity, "abort_all_requests": False},
        )
        if response.status_code != 200 or json_object(response).get("success") is False:
            raise EngineRejected(
                f"SGLang refused the weight version: {response_detail(response)}",
                url=self.base_url,
                identity=identity,
                status=response.status_code,
            )

    async def pause(self, mode: PauseMode) -> None:
        if mode is PauseMode.WAIT:
            return  # an unpaused update already waits for in-flight generations
        response = await self._http.request("POST", "/pause_generation", json={"mode": "in_place"})
        if response.status_code != 200:
            raise EngineBusy(
                f"SGLang did not pause: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )

    async def resume(self) -> None:
        response = await self._http.request("POST", "/continue_generation", json={})
        if response.status_code != 200:
            raise EngineBusy(
                f"SGLang did not continue: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        if policy is not KvCachePolicy.ALL:
            return
        response = await self._http.request(
            "POST",
            "/flush_cache",
            params={"timeout": self._flush_timeout},
            timeout=self._flush_timeout + 10.0,
        )
        if response.status_code != 200:
            raise EngineBusy(
                f"SGLang refused to flush its cache: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._lora.active is not None and path in _GENERATION_PATHS:
            return {**body, "lora_path": self._lora.active}
        return body

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        return weight_versions(payload)
