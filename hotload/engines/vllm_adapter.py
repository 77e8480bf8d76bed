"""Adapter for vLLM (written against 0.33.0, run here against 0.32.0): docs/engines.md.

The admin routes exist only when the server runs with ``VLLM_SERVER_DEV_MODE=1`` (LoRA
routes need ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``); a 404 for a route that is not
registered (``error.type`` "Not Found") is reported as ``EngineRejected`` naming the flag.
What differs between releases is probed, never assumed (:meth:`VLLMEngine.probe`): the
server's own OpenAPI schema says whether ``/v1`` requests take ``return_weight_versions``
(0.33.0 yes, 0.32.0 no).

- Full/Incremental: the directory's safetensors headers are read first
  (:mod:`hotload.engines.checkpoint_check`): a missing directory, a corrupt header or a
  truncated file would leave vLLM without weights, and its next request would kill it;
  such a load is refused before anything is sent (``LoadNotStarted``). Then
  ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR,
  "is_checkpoint_format": true}}``, then ``POST /update_weight_version {"new_version":
  identity}``. There is no rollback: after a failed reload the weights are unknown
  (``rollback_trusted`` is False), so the engine's label is set to
  :data:`UNKNOWN_VERSION` at once (its responses then name no snapshot) and the sidecar
  reloads its served buffer before any request runs. vLLM also drops its keep-alive
  connections after a failed reload: pause, resume and the version are sent again once
  when the connection breaks. A directory that held other weights at the previous load
  is refused (stale weights): staging gives each snapshot its own directory.
- LoRA: ``POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}`` (plain text
  answer), unload the previous adapter, then record the version; requests name the
  adapter as their ``model``. A 404 of type ``NotFoundError`` means the path was not
  found. Which adapter is served is rebuilt from the engine after a sidecar restart:
  ``/v1/models`` lists loaded adapters (``parent`` = the base model).
- Pause: ``POST /pause?mode=keep`` (in-flight freeze, new requests queue), always with
  ``clear_cache``: ``false`` keeps the prefix cache and the running requests' KV
  (``true``, vLLM's default, preempts them all), ``true`` only for the ``all`` cache
  policy, which it then fully applies; ``POST /resume``. ``mode=wait`` is never sent:
  0.33.0 answers new requests 503 in it; ``PauseMode.WAIT`` holds in place too.
- Cache without such a pause: ``POST /reset_prefix_cache`` answers ``{"success": false}``
  while blocks are held: retried for ``flush_timeout`` s, then ``EngineBusy``. The prefix
  cache is shared, so ``none`` and ``new_session`` keep it.
- Identity: ``GET /weight_info`` (the launch value ``"default"`` means nothing hotload
  loaded). Where offered, generation requests get ``return_weight_versions: true``; each
  choice then carries ``weight_versions`` spans (in a stream, only the last chunk).
- Instance: ``vllm_config.instance_id`` of ``GET /server_info?config_format=json`` (its
  first call runs ``collect_env``: seconds; a report waits :data:`INSTANCE_WAIT_S` for it
  and goes on without the id, the request continuing for the next report), cached;
  each API-server process has its own id (``--api-server-count``), so a new id is a
  restart only when the version also fell back to the launch value, else another API
  server of the same engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.admin_http import json_object, response_detail
from hotload.engines.checkpoint_check import check_checkpoint
from hotload.engines.engine_checksum import ChecksumLedger, checksums_digest
from hotload.engines.http_adapter import HttpEngine
from hotload.engines.identity_fields import UNKNOWN_VERSION, weight_versions
from hotload.engines.lora_slot import LoraSlot
from hotload.engines.protocol import EngineReport, PauseMode
from hotload.errors import EngineBusy, EngineRejected, EngineUnavailable, HotloadError
from hotload.waiting import wait_until_async

log = logging.getLogger(__name__)

DEFAULT_LOAD_TIMEOUT = 1800.0
DEFAULT_FLUSH_TIMEOUT = 30.0
#: vLLM's ``EngineCore._weight_version`` at start: what it reports before any update.
LAUNCH_VERSION = "default"
#: The first ``/server_info`` runs ``collect_env`` (seconds on a busy node).
SERVER_INFO_TIMEOUT = 60.0
#: How long a report waits for ``/server_info`` before it goes on without the instance id
#: (the request continues in the background; its answer serves the next report): after
#: the first call (``collect_env``: 3-11 s measured) it answers in milliseconds, and a
#: restart also shows at once as the version back at its launch value.
INSTANCE_WAIT_S = 1.0
#: sha256 of nothing: what ``/weight_checker`` reports for a parameter it cannot read
#: (on CPU every linear layer, repacked by oneDNN).
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
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
        engine's own checksum the same snapshot gave before — where that checksum covers
        every parameter (:meth:`weights_checksum`)."""
        self._last_load: tuple[Path, str] | None = None
        """(directory, identity) of the last reload sent: the stale-directory guard."""
        self._cleared = False
        """This swap's pause already cleared the prefix cache (``clear_cache=true``)."""
        self.offers_spans: bool | None = None
        """Whether ``/v1`` requests take ``return_weight_versions`` (None: not probed)."""
        self._instance: str | None = None
        """The engine's instance id as reported (the first API server's id)."""
        self._siblings: set[str] = set()
        """Ids of other API-server processes of the same engine start."""
        self._lora_synced: tuple[str | None, str | None] | None = None
        """(instance, identity) for which the served adapter was read from the engine."""
        self._instance_ask: asyncio.Task[str | None] | None = None
        """A ``/server_info`` still under way (the first runs ``collect_env``)."""

    @property
    def kind(self) -> EngineKind:
        return EngineKind.VLLM

    @property
    def rollback_trusted(self) -> bool:
        """False: ``reload_weights`` has no rollback (see the module doc)."""
        return False

    async def wait_ready(self, timeout: float) -> None:
        await super().wait_ready(timeout)
        await self.probe()

    async def probe(self) -> None:
        """Learn once what this server offers: whether ``/v1`` requests take
        ``return_weight_versions`` (its OpenAPI schema; 0.33.0 yes, 0.32.0 no). An
        engine that does not answer now is probed again next time."""
        if self.offers_spans is not None:
            return
        response = await self._http.request("GET", "/openapi.json", timeout=SERVER_INFO_TIMEOUT)
        if response.status_code != 200:
            self.offers_spans = False
            return
        schemas = json_object(response).get("components", {}).get("schemas", {})
        request = schemas.get("CompletionRequest", {}) if isinstance(schemas, dict) else {}
        properties = request.get("properties", {}) if isinstance(request, dict) else {}
        self.offers_spans = "return_weight_versions" in properties
        log.info("vLLM probed", extra={"url": self.base_url, "spans_on_v1": self.offers_spans})

    async def report(self, *, digest: bool = False) -> EngineReport:
        """The weight version it serves (None for its launch value or an unknown one)
        and its instance id. No digest: vLLM's checksums are of its own parameters, not
        the snapshot's."""
        version = await self._weight_version()
        try:
            instance = await self._current_instance(version)
        except EngineRejected:
            instance = None  # /server_info needs dev mode; the identity still tells
        identity = self._identity(version)
        await self._sync_lora(instance, identity)
        if self.offers_spans is None:
            with contextlib.suppress(EngineUnavailable):
                await self.probe()
        return EngineReport(identity, instance, None, paused=await self._holding())

    async def _holding(self) -> bool | None:
        """``GET /is_paused`` (dev mode: ``entrypoints/rl/online/api_router.py``); None
        where it does not answer. vLLM offers nothing that changes with a reload (no
        generation): ``weight_version`` is what the last ``/update_weight_version`` said."""
        try:
            response = await self._http.request("GET", "/is_paused")
        except EngineUnavailable:
            return None
        if response.status_code != 200:
            return None
        paused = json_object(response).get("is_paused")
        return paused if isinstance(paused, bool) else None

    @property
    def active_lora(self) -> str | None:
        return self._lora.active

    def _identity(self, version: str | None) -> str | None:
        if version in (None, "", self._launch_version, UNKNOWN_VERSION):
            return None
        return version

    async def served_identity(self) -> str | None:
        """``weight_version`` of ``/weight_info``; None for the launch value."""
        return self._identity(await self._weight_version())

    async def _weight_version(self) -> str | None:
        response = await self._http.request("GET", "/weight_info", retry_dropped=True)
        self._check_route(response, "/weight_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "vLLM /weight_info failed", url=self.base_url, status=response.status_code
            )
        version = json_object(response).get("weight_version")
        return str(version) if version not in (None, "") else None

    async def _current_instance(self, version: str | None) -> str | None:
        """The instance id to report: the cached one while the engine has not restarted.

        ``/server_info`` is asked on every report (after the first it answers in
        milliseconds); an id never seen is a restart when the version is the launch
        value again (the label a restart always resets), else another API-server process
        of the same engine (each has its own id) and the cached id stands."""
        at_launch = version in (None, "", self._launch_version)
        try:
            seen = await self._instance_answer()
        except EngineUnavailable:
            # Slow (collect_env) or dropped: the report is not lost for want of an id. The
            # id of this start stands — unless the version is back at its launch value (a
            # restart, or nothing loaded yet): then an earlier start's id must not stand
            # for this one, and the id that comes next is this start's.
            if at_launch:
                self._instance, self._siblings = None, set()
            return self._instance
        if seen is None:
            return self._instance
        if self._instance is None or seen == self._instance or seen in self._siblings:
            self._instance = self._instance or seen
            return self._instance
        if at_launch:
            self._instance, self._siblings = seen, set()  # restarted
        else:
            self._siblings.add(seen)
        return self._instance

    async def _instance_answer(self) -> str | None:
        """``/server_info``'s id if it answers within :data:`INSTANCE_WAIT_S`; else
        ``EngineUnavailable`` while the request goes on for the next report."""
        ask = self._instance_ask
        if ask is None:
            ask = self._instance_ask = asyncio.ensure_future(self.instance_id())
        done, _ = await asyncio.wait({ask}, timeout=INSTANCE_WAIT_S)
        if not done:
            raise EngineUnavailable(
                "vLLM /server_info is still answering", url=self.base_url, timeout=INSTANCE_WAIT_S
            )
        self._instance_ask = None
        return ask.result()

    async def aclose(self) -> None:
        ask, self._instance_ask = self._instance_ask, None
        if ask is not None and not ask.done():
            ask.cancel()
            with contextlib.suppress(asyncio.CancelledError, HotloadError):
                await ask
        await super().aclose()

    async def instance_id(self) -> str | None:
        """``vllm_config.instance_id`` of dev-mode ``/server_info`` (the start time in ns
        of the API-server process that answers)."""
        response = await self._http.request(
            "GET",
            "/server_info",
            params={"config_format": "json"},
            timeout=SERVER_INFO_TIMEOUT,
            retry_dropped=True,
        )
        self._check_route(response, "/server_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "vLLM /server_info failed", url=self.base_url, status=response.status_code
            )
        config = json_object(response).get("vllm_config")
        value = config.get("instance_id") if isinstance(config, dict) else None
        return str(value) if value not in (None, "") else None

    async def _sync_lora(self, instance: str | None, identity: str | None) -> None:
        """Rebuild which adapter requests go to from the engine itself (a restarted
        sidecar knows nothing): ``/v1/models`` lists loaded adapters with the base model
        as ``parent``; the one named like the served identity is served."""
        key = (instance, identity)
        if identity is None or identity == self._lora.active or self._lora_synced == key:
            return
        response = await self._http.request("GET", "/v1/models", retry_dropped=True)
        if response.status_code != 200:
            return
        self._lora_synced = key
        self._lora.adopt(json_object(response), identity)

    async def weights_checksum(self) -> str | None:
        """One digest over ``/weight_checker``'s sha256 of every parameter vLLM holds
        (copies each to the CPU: costly). Comparable only with another from this engine.
        None when some parameter hashes as empty (on CPU every linear layer, repacked by
        oneDNN): such a checksum cannot see a change to those layers, so it is evidence
        of nothing and is not used."""
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
        blind = sorted(str(name) for name, value in checksums.items() if value == _EMPTY_SHA256)
        if blind:
            log.warning(
                "vLLM's weight checksum skips parameters it cannot read; not used",
                extra={"url": self.base_url, "unread": len(blind), "of": len(checksums)},
            )
            return None
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
        check_checkpoint(path)
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
            await self._mark_unknown()
            raise EngineRejected(
                f"vLLM failed to reload (what it serves now is unknown): "
                f"{response_detail(response)}",
                url=self.base_url,
                identity=identity,
                path=str(path),
                status=response.status_code,
            )
        await self._set_version(identity)
        replaced = self._lora.route(None)
        if replaced is not None:
            await self._lora.unload(replaced)
        if self._checksums is not None:
            checksum = await self.weights_checksum()
            if checksum is not None:
                self._checksums.check(identity, checksum, url=self.base_url)

    async def _mark_unknown(self) -> None:
        """After a failed reload: the engine's label names no snapshot (best effort)."""
        try:
            await self._set_version(UNKNOWN_VERSION)
        except (EngineRejected, EngineUnavailable) as err:
            log.warning(
                "vLLM still names the weights it served before a failed reload",
                extra={"url": self.base_url, "error": str(err)},
            )

    async def _load_lora(self, path: Path, identity: Identity) -> None:
        check_checkpoint(path, adapter=True)
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
        replaced = self._lora.route(identity)
        await self._set_version(identity)
        if replaced is not None:
            await self._lora.unload(replaced)

    async def _set_version(self, identity: Identity) -> None:
        response = await self._http.request(
            "POST", "/update_weight_version", json={"new_version": identity}, retry_dropped=True
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
        """``keep`` with ``clear_cache`` sent explicitly: vLLM's default (true) would
        preempt every running request and wipe the prefix cache, which only the ``all``
        policy wants (and then gets, at once, with nothing left to reset). ``WAIT`` is
        held in place too: vLLM's ``mode=wait`` answers new requests 503 in 0.33.0
        (0.32.0 held them), and no other mode lets running requests finish while new
        ones wait (the sidecar drains in its front for SYNC and never asks for it)."""
        del mode  # both modes hold in place (see above)
        clear = cache_policy is KvCachePolicy.ALL
        params = {"mode": "keep", "clear_cache": "true" if clear else "false"}
        response = await self._http.request("POST", "/pause", params=params, retry_dropped=True)
        self._check_route(response, "/pause")
        if response.status_code != 200:
            raise EngineBusy(
                f"vLLM did not pause: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        self._cleared = clear

    async def resume(self) -> None:
        response = await self._http.request("POST", "/resume", retry_dropped=True)
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
        prepared = dict(body)
        if self.offers_spans:
            prepared["return_weight_versions"] = True
        if self._lora.active is not None:
            prepared["model"] = self._lora.active
        return prepared

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        """Each choice's ``weight_versions`` spans; the launch value and the label of
        unknown weights name no snapshot."""
        return [
            v for v in weight_versions(payload) if v not in (self._launch_version, UNKNOWN_VERSION)
        ]

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
