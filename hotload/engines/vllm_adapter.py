"""Adapter for vLLM 0.33.0, as the released server behaves (docs/engines.md, table 1-8).

The admin routes exist only when the server runs with ``VLLM_SERVER_DEV_MODE=1`` (LoRA
routes need ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``); a 404 for a route that is not
registered (``error.type`` "Not Found") is reported as ``EngineRejected`` naming the flag.

- Full/Incremental: ``POST /collective_rpc {"method": "reload_weights", "kwargs":
  {"weights_path": DIR, "is_checkpoint_format": true}}``, then
  ``POST /update_weight_version {"new_version": identity}``. There is no rollback: after
  a failed reload the weights are unknown (``rollback_trusted`` is False). A directory
  that held other weights at the previous load is refused (stale weights): staging gives
  each snapshot its own directory; reloading the same snapshot from it is fine.
- LoRA: ``POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace: false}`` (plain
  text answer), unload the previous adapter, then record the version; requests name the
  adapter as their ``model``. A 404 of type ``NotFoundError`` means the path was not found.
- Pause: ``POST /pause?mode=keep`` (in-flight freeze, new requests queue) or
  ``mode=wait``, always with ``clear_cache``: ``false`` keeps the prefix cache and the
  running requests' KV (``true``, vLLM's default, preempts them all), ``true`` only for
  the ``all`` cache policy, which it then fully applies; ``POST /resume``.
- Cache without such a pause: ``POST /reset_prefix_cache`` answers ``{"success": false}``
  while blocks are held: retried for ``flush_timeout`` s, then ``EngineBusy``. The prefix
  cache is shared, so ``none`` and ``new_session`` keep it.
- Identity: ``GET /weight_info`` (the launch value ``"default"`` means nothing hotload
  loaded). Generation requests get ``return_weight_versions: true``; each choice then
  carries ``weight_versions`` spans (in a stream, only the last chunk).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.admin_http import json_object, response_detail
from hotload.engines.engine_checksum import ChecksumLedger, checksums_digest
from hotload.engines.http_adapter import HttpEngine
from hotload.engines.identity_fields import weight_versions
from hotload.engines.lora_slot import LoraSlot
from hotload.engines.protocol import EngineReport, PauseMode
from hotload.errors import EngineBusy, EngineRejected, EngineUnavailable
from hotload.waiting import wait_until_async

DEFAULT_LOAD_TIMEOUT = 1800.0
DEFAULT_FLUSH_TIMEOUT = 30.0
#: vLLM's ``EngineCore._weight_version`` at start: what it reports before any update.
LAUNCH_VERSION = "default"
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
_DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (admin routes are dev-mode only)"
_LORA_HINT = "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and --enable-lora"


class VLLMEngine(HttpEngine):
    """Drives a running vLLM OpenAI server over its dev-mode admin routes."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        *,
        api_key: str | None = None,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
        flush_retry_interval: float = 0.5,
        launch_version: str = LAUNCH_VERSION,
        verify_digest: bool = False,
    ) -> None:
        super().__init__(base_url, client, api_key=api_key)
        self._load_timeout = load_timeout
        self._flush_timeout = flush_timeout
        self._flush_retry_interval = flush_retry_interval
        self._lora = LoraSlot(self._http, engine="vLLM", unload_path="/v1/unload_lora_adapter")
        self._launch_version = launch_version
        self._checksums = ChecksumLedger("vLLM") if verify_digest else None
        """``spec.engine.verifyDigest``: each Full/Incremental load is checked against the
        engine's own checksum the same snapshot gave before."""
        self._last_load: tuple[Path, str] | None = None
        """(directory, identity) of the last reload sent: the stale-directory guard."""
        self._cleared = False
        """This swap's pause already cleared the prefix cache (``clear_cache=true``)."""

    @property
    def kind(self) -> EngineKind:
        return EngineKind.VLLM

    @property
    def rollback_trusted(self) -> bool:
        """False: ``reload_weights`` has no rollback (see the module doc)."""
        return False

    async def report(self, *, digest: bool = False) -> EngineReport:
        """The weight version it serves (None for its launch value) and its instance id.
        No digest: vLLM's checksums are of its own parameters, not the snapshot's."""
        identity = await self.served_identity()
        try:
            instance = await self.instance_id()
        except EngineRejected:
            instance = None  # /server_info needs dev mode; the identity still tells
        return EngineReport(identity, instance, None)

    @property
    def active_lora(self) -> str | None:
        return self._lora.active

    async def served_identity(self) -> str | None:
        """``weight_version`` of ``/weight_info``; None for the launch value."""
        response = await self._http.request("GET", "/weight_info")
        self._check_route(response, "/weight_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "vLLM /weight_info failed", url=self.base_url, status=response.status_code
            )
        version = json_object(response).get("weight_version")
        if version in (None, "", self._launch_version):
            return None
        return str(version)

    async def instance_id(self) -> str | None:
        """``vllm_config.instance_id`` of dev-mode ``/server_info`` (the start time in ns):
        it changes whenever the engine process restarts."""
        response = await self._http.request("GET", "/server_info", params={"config_format": "json"})
        self._check_route(response, "/server_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "vLLM /server_info failed", url=self.base_url, status=response.status_code
            )
        config = json_object(response).get("vllm_config")
        value = config.get("instance_id") if isinstance(config, dict) else None
        return str(value) if value not in (None, "") else None

    async def weights_checksum(self) -> str:
        """One digest over ``/weight_checker``'s sha256 of every parameter vLLM holds
        (copies each to the CPU: costly). Comparable only with another from this engine."""
        response = await self._http.request(
            "POST", "/weight_checker", json={"action": "checksum"}, timeout=self._load_timeout
        )
        self._check_route(response, "/weight_checker")
        checksums = json_object(response).get("checksums")
        if response.status_code != 200 or not isinstance(checksums, dict) or not checksums:
            raise EngineUnavailable(
                f"vLLM did not checksum its weights: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        return checksums_digest({str(k): str(v) for k, v in checksums.items()})

    async def load_weights(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        if kind is SnapshotKind.LORA:
            await self._load_lora(path, identity)
            return
        last = self._last_load
        if last is not None and last[0] == path and last[1] != identity:
            raise EngineRejected(
                "vLLM may keep stale weights when a directory it loaded from is "
                "reloaded with other weights: stage each snapshot in its own directory",
                url=self.base_url,
                identity=identity,
                path=str(path),
                previous=last[1],
            )
        self._last_load = (path, identity)
        response = await self._http.request(
            "POST",
            "/collective_rpc",
            json={
                "method": "reload_weights",
                "kwargs": {"weights_path": str(path), "is_checkpoint_format": True},
            },
            timeout=self._load_timeout,
        )
        self._check_route(response, "/collective_rpc")
        if response.status_code != 200:
            raise EngineRejected(
                f"vLLM failed to reload (what it serves now is unknown): "
                f"{response_detail(response)}",
                url=self.base_url,
                identity=identity,
                path=str(path),
                status=response.status_code,
            )
        await self._set_version(identity)
        await self._lora.clear()
        if self._checksums is not None:
            self._checksums.check(identity, await self.weights_checksum(), url=self.base_url)

    async def _load_lora(self, path: Path, identity: Identity) -> None:
        # Loading the served adapter again (a reload after a failed load or a restart):
        # vLLM refuses a name it holds unless load_inplace is set.
        again = self._lora.active == identity
        response = await self._http.request(
            "POST",
            "/v1/load_lora_adapter",
            json={"lora_name": identity, "lora_path": str(path), "load_inplace": again},
            timeout=self._load_timeout,
        )
        if _route_missing(response):
            raise EngineRejected(
                f"vLLM has no LoRA loading route: {_LORA_HINT}",
                url=self.base_url,
                identity=identity,
            )
        if response.status_code == 404:
            raise EngineRejected(
                f"vLLM could not find the LoRA adapter: {response_detail(response)}",
                url=self.base_url,
                identity=identity,
                path=str(path),
                status=404,
            )
        if response.status_code != 200:
            raise EngineRejected(
                f"vLLM refused the LoRA adapter: {response_detail(response)}",
                url=self.base_url,
                identity=identity,
                path=str(path),
                status=response.status_code,
            )
        await self._lora.replace(identity)
        await self._set_version(identity)

    async def _set_version(self, identity: Identity) -> None:
        response = await self._http.request(
            "POST", "/update_weight_version", json={"new_version": identity}
        )
        self._check_route(response, "/update_weight_version")
        if response.status_code != 200:
            raise EngineRejected(
                f"vLLM refused the weight version: {response_detail(response)}",
                url=self.base_url,
                identity=identity,
                status=response.status_code,
            )

    async def pause(self, mode: PauseMode, *, cache_policy: KvCachePolicy | None = None) -> None:
        """``keep`` or ``wait`` with ``clear_cache`` sent explicitly: vLLM's default (true)
        would preempt every running request and wipe the prefix cache, which only the
        ``all`` policy wants (and then gets, at once, with nothing left to reset)."""
        vllm_mode = "keep" if mode is PauseMode.IN_PLACE else "wait"
        clear = cache_policy is KvCachePolicy.ALL
        params = {"mode": vllm_mode, "clear_cache": "true" if clear else "false"}
        response = await self._http.request("POST", "/pause", params=params)
        self._check_route(response, "/pause")
        if response.status_code != 200:
            raise EngineBusy(
                f"vLLM did not pause: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        self._cleared = clear

    async def resume(self) -> None:
        response = await self._http.request("POST", "/resume")
        self._check_route(response, "/resume")
        if response.status_code != 200:
            raise EngineBusy(
                f"vLLM did not resume: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        if policy is not KvCachePolicy.ALL:
            return
        if self._cleared:
            self._cleared = False
            return  # the pause cleared it, running requests included
        status: int | None = None

        async def reset() -> bool:
            nonlocal status
            response = await self._http.request("POST", "/reset_prefix_cache")
            self._check_route(response, "/reset_prefix_cache")
            status = response.status_code
            return status == 200 and json_object(response).get("success", True) is not False

        if not await wait_until_async(
            reset, self._flush_timeout, interval_s=self._flush_retry_interval
        ):
            raise EngineBusy(
                "vLLM kept refusing to reset its prefix cache (blocks held by requests)",
                url=self.base_url,
                status=status,
                timeout=self._flush_timeout,
            )

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path not in _GENERATION_PATHS:
            return body
        prepared = {**body, "return_weight_versions": True}
        if self._lora.active is not None:
            prepared["model"] = self._lora.active
        return prepared

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        """Each choice's ``weight_versions`` spans; the launch value names no snapshot."""
        return [v for v in weight_versions(payload) if v != self._launch_version]

    def _check_route(self, response: httpx.Response, route: str) -> None:
        if _route_missing(response):
            raise EngineRejected(
                f"vLLM has no {route} route: {_DEV_MODE_HINT}", url=self.base_url, route=route
            )


def _route_missing(response: httpx.Response) -> bool:
    """A 404 for a route vLLM did not register (its HTTPException handler: ``error.type``
    "Not Found"), as opposed to one of its handlers' ``NotFoundError`` answers."""
    if response.status_code != 404:
        return False
    error = json_object(response).get("error")
    return not (isinstance(error, dict) and error.get("type") == "NotFoundError")
