"""Adapter for SGLang 0.5.23, as the released server behaves (docs/engines.md).

File and line references are to the release's wheel (``sglang/srt/...``), read for this
adapter; :mod:`hotload.testing.sglang_app` behaves as they say.

- Full/Incremental: ``POST /update_weights_from_disk`` with ``model_path``,
  ``weight_version`` = identity and ``abort_all_requests: false``. Unpaused it waits for
  in-flight generations; paused it applies at once. Anything but ``success: true`` is
  :class:`EngineRejected`, and the weights are then unknown: 0.5.23 "rolls back" by
  re-reading the new path (``rollback_trusted`` is False) and keeps reporting the old
  version, so the adapter names the engine :data:`UNKNOWN_VERSION` at once. The update
  flushes the cache itself (``flush_cache: true``) only when paused in ``retract`` mode
  for the ``all`` policy: that flush runs while paused, when the waiting queue does not
  count (``managers/scheduler.py:5518-5546``).
- LoRA: ``POST /load_lora_adapter {lora_name, lora_path, pinned}``, then ``POST
  /update_weight_version``, then the adapter it replaces is unloaded — never while
  paused: an unload waits for every request using the adapter
  (``managers/tokenizer_control_mixin.py:633-657``), which a pause holds, so it is sent
  after ``/continue_generation``; bounded, logged, never raised. Requests name the
  adapter in ``lora_path``. Needs ``--enable-lora`` (and, without ``--lora-paths``,
  ``--max-lora-rank`` and ``--lora-target-modules``). A restarted sidecar reads the
  served adapter back from ``GET /v1/models`` (adapters have ``parent`` = the base).
- Pause: ``POST /pause_generation {"mode": "in_place"}``, or ``"retract"`` when the cache
  policy is ``all`` (running requests re-queued, their KV dropped and recomputed on the
  new weights). After a ``retract`` pause whose load did not flush, ``resume`` flushes
  with ``timeout=0`` before ``/continue_generation``: a flush with a timeout needs the
  waiting queue empty, which retract fills (``scheduler_components/flush_wrapper.py:
  22-61``), so it would hold the pause for the whole timeout and fail.
  ``PauseMode.WAIT`` sends nothing: an unpaused update already waits.
- Cache without a pause: ``POST /flush_cache?timeout=S`` (waits up to S s for an idle
  engine). The radix cache is shared by prefix, not by session: ``none`` and
  ``new_session`` keep it.
- Health: ``GET /ping`` (``is_healthy``: 200 while paused). ``/ready`` answers 503 for the
  whole of a pause (``entrypoints/http_server.py:714-718``) and ``/health`` runs a
  generation a pause holds (20 s, then 503).
- Requests: after a disk update SGLang serves under the loaded path
  (``served_model_name``, read from ``/model_info`` on every report), so generation
  requests name that as their ``model``.
- Keys: admin routes carry the admin key (else the API key); ``/model_info``, ``/ping``
  and ``/v1/models`` the API key.
- Identity: ``/model_info`` ``weight_version``; the launch value (``--weight-version``,
  ``spec.engine.launchVersion``, default ``"default"``) means nothing hotload loaded. Per
  response: ``metadata.weight_version(s)`` on non-streamed ``/v1`` answers; stream chunks
  name none (the sidecar labels them; docs/engines.md says the window).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import httpx

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.admin_http import AdminHttp, json_object, response_detail
from hotload.engines.engine_checksum import ChecksumLedger
from hotload.engines.http_adapter import HttpEngine
from hotload.engines.identity_fields import UNKNOWN_VERSION, weight_versions
from hotload.engines.lora_slot import LoraSlot
from hotload.engines.protocol import EngineReport, PauseMode
from hotload.errors import EngineBusy, EngineRejected, EngineUnavailable

log = logging.getLogger(__name__)

DEFAULT_LOAD_TIMEOUT = 1800.0
DEFAULT_FLUSH_TIMEOUT = 30.0
#: SGLang's ``--weight-version`` default: what it reports before any update.
LAUNCH_VERSION = "default"
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class SGLangEngine(HttpEngine):
    """Drives a running SGLang server over its HTTP admin API."""

    health_path: ClassVar[str] = "/ping"

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        *,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
        launch_version: str = LAUNCH_VERSION,
        verify_digest: bool = False,
    ) -> None:
        super().__init__(base_url, client, api_key=admin_api_key or api_key)
        self._info = self._http.with_key(api_key)
        """``/model_info``, ``/ping`` and ``/v1`` take the API key only (admin routes:
        the admin key)."""
        self._load_timeout = load_timeout
        self._flush_timeout = flush_timeout
        self._launch_version = launch_version
        self._checksums = ChecksumLedger("SGLang") if verify_digest else None
        """``spec.engine.verifyDigest``: each Full/Incremental load is checked against the
        engine's own checksum the same snapshot gave before."""
        self._lora = LoraSlot(self._http, engine="SGLang", unload_path="/unload_lora_adapter")
        self._paused: str | None = None
        """The mode this adapter paused SGLang in (``in_place``, ``retract``), until resumed."""
        self._flushed = False
        """The ``all`` policy's flush already happened during this swap's pause."""
        self._unload_after_resume: list[str] = []
        """Adapters replaced while paused: unloaded once generation continues."""
        self._served_model: str | None = None
        """SGLang's ``served_model_name`` now: it becomes the loaded path on every disk
        update (``tokenizer_manager._update_model_path_info``)."""
        self._lora_synced: str | None = None
        """The identity for which the served adapter was read from ``/v1/models``."""

    @property
    def kind(self) -> EngineKind:
        return EngineKind.SGLANG

    @property
    def rollback_trusted(self) -> bool:
        """False: a failed update leaves the weights part new, part old (see module doc)."""
        return False

    def _health_http(self) -> AdminHttp:
        """``GET /ping`` takes the API key (it is no probe path to SGLang's auth)."""
        return self._info

    async def report(self, *, digest: bool = False) -> EngineReport:
        """The weight version it serves (None for its launch value or unknown weights).
        No instance id: a restart shows as the version returning to its launch value. No
        digest: SGLang's checksums are of its own fused parameters, not the snapshot's.
        The generation is ``model_path``, which every disk update sets to the path it
        loaded (a foreign update under the served version shows there); paused is
        ``/ready`` answering 503 while ``/model_info`` answers (``http_server.py:714-718``:
        ``not is_pause and is_healthy()``)."""
        info = await self._model_info()
        served = info.get("served_model_name")
        if isinstance(served, str) and served:
            self._served_model = served
        identity = self._identity(info.get("weight_version"))
        await self._sync_lora(identity)
        path = info.get("model_path")
        return EngineReport(
            identity,
            None,
            None,
            generation=path if isinstance(path, str) and path else None,
            paused=await self._holding(),
        )

    async def _holding(self) -> bool | None:
        """``/ready``: 503 while paused (or unhealthy, which a resume does not harm)."""
        try:
            response = await self._info.request("GET", "/ready")
        except EngineUnavailable:
            return None
        if response.status_code == 503:
            return True
        return False if response.status_code == 200 else None

    @property
    def active_lora(self) -> str | None:
        """The adapter name requests are routed to, if a LoRA snapshot is served."""
        return self._lora.active

    async def served_identity(self) -> str | None:
        """``weight_version`` of ``/model_info``; None for the launch value."""
        return self._identity((await self._model_info()).get("weight_version"))

    def _identity(self, version: object) -> str | None:
        if version in (None, "", self._launch_version, UNKNOWN_VERSION):
            return None
        return str(version)

    async def _model_info(self) -> dict[str, Any]:
        response = await self._info.request("GET", "/model_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "SGLang /model_info failed", url=self.base_url, status=response.status_code
            )
        return json_object(response)

    async def _sync_lora(self, identity: str | None) -> None:
        """Which adapter requests go to, read back from the engine (a restarted sidecar
        knows nothing; without it the base weights would answer under the LoRA's name)."""
        if identity is None or identity == self._lora.active or identity == self._lora_synced:
            return
        response = await self._info.request("GET", "/v1/models")
        if response.status_code == 200:
            self._lora_synced = identity
            self._lora.adopt(json_object(response), identity)

    async def weights_checksum(self) -> str:
        """``per_engine_checksum`` of ``/weights_checker`` (a hash over every rank's hashes
        of SGLang's own fused, sharded parameters): comparable only with another one."""
        response = await self._http.request(
            "POST", "/weights_checker", json={"action": "checksum"}, timeout=self._load_timeout
        )
        body = json_object(response)
        checksum = body.get("per_engine_checksum")
        if response.status_code != 200 or body.get("success") is not True or not checksum:
            raise EngineUnavailable(
                f"SGLang did not checksum its weights: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        return str(checksum)

    async def load_weights(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        if kind is SnapshotKind.LORA:
            await self._load_lora(path, identity)
            return
        flush = self._paused == "retract" and not self._flushed
        response = await self._http.request(
            "POST",
            "/update_weights_from_disk",
            json={
                "model_path": str(path),
                "weight_version": identity,
                "flush_cache": flush,
                "abort_all_requests": False,
            },
            timeout=self._load_timeout,
        )
        body = json_object(response)
        if response.status_code == 200 and body.get("success") is True:
            self._served_model = str(path)
            self._flushed = self._flushed or flush
            await self._unload_replaced(self._lora.route(None))
            if self._checksums is not None:
                self._checksums.check(identity, await self.weights_checksum(), url=self.base_url)
            return
        await self._mark_unknown()
        detail = str(body.get("message") or response_detail(response))
        raise EngineRejected(
            f"SGLang refused the weights (what it serves now is unknown): {detail}",
            url=self.base_url,
            identity=identity,
            path=str(path),
            status=response.status_code,
        )

    async def _mark_unknown(self) -> None:
        """After a failed update: 0.5.23 still names the old version over part-new
        weights; name none instead (best effort), so no response claims the old one."""
        try:
            await self._set_version(UNKNOWN_VERSION)
        except (EngineRejected, EngineUnavailable) as err:
            log.warning(
                "SGLang still names the weights it served before a failed update",
                extra={"url": self.base_url, "error": str(err)},
            )

    async def _load_lora(self, path: Path, identity: Identity) -> None:
        if self._lora.active == identity:
            # Loading it again (a reload after a failed load or a restart): SGLang refuses
            # a name it holds ("already exists"), so it goes first.
            self._lora.route(None)
            await self._lora.unload(identity)
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
        replaced = self._lora.route(identity)
        await self._set_version(identity)
        await self._unload_replaced(replaced)

    async def _unload_replaced(self, name: str | None) -> None:
        """Unload an adapter no request is routed to any more — after the resume when
        paused: the unload waits for the requests using it, which the pause holds."""
        if name is None:
            return
        if self._paused is not None:
            self._unload_after_resume.append(name)
            return
        await self._lora.unload(name, timeout=self._flush_timeout)

    async def _set_version(self, identity: Identity) -> None:
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

    async def pause(self, mode: PauseMode, *, cache_policy: KvCachePolicy | None = None) -> None:
        """``in_place`` keeps running requests' KV; for the ``all`` policy ``retract``
        drops it (they re-prefill on the new weights) and lets the flush run paused."""
        self._flushed = False
        if mode is PauseMode.WAIT:
            return  # an unpaused update already waits for in-flight generations
        engine_mode = "retract" if cache_policy is KvCachePolicy.ALL else "in_place"
        response = await self._http.request("POST", "/pause_generation", json={"mode": engine_mode})
        if response.status_code != 200:
            raise EngineBusy(
                f"SGLang did not pause: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        self._paused = engine_mode

    async def resume(self) -> None:
        """Continue generation; after a ``retract`` pause whose load did not flush, flush
        first with ``timeout=0`` (paused, the re-queued requests do not count); then
        unload the adapters replaced during the pause."""
        if self._paused == "retract" and not self._flushed:
            self._flushed = await self._flush(timeout=0.0)
        response = await self._http.request("POST", "/continue_generation", json={})
        if response.status_code != 200:
            raise EngineBusy(
                f"SGLang did not continue: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        self._paused = None
        replaced, self._unload_after_resume = self._unload_after_resume, []
        for name in replaced:
            await self._lora.unload(name, timeout=self._flush_timeout)

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        if policy is not KvCachePolicy.ALL:
            return
        if self._flushed:
            self._flushed = False
            return  # flushed while paused in retract mode
        if not await self._flush(timeout=self._flush_timeout):
            raise EngineBusy(
                "SGLang refused to flush its cache (requests running past the timeout)",
                url=self.base_url,
                timeout=self._flush_timeout,
            )

    async def _flush(self, *, timeout: float) -> bool:
        response = await self._http.request(
            "POST", "/flush_cache", params={"timeout": timeout}, timeout=timeout + 10.0
        )
        if response.status_code != 200:
            log.warning(
                "SGLang refused to flush its cache",
                extra={"status": response.status_code, "engine_message": response.text[:200]},
            )
        return response.status_code == 200

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Generation requests name the model SGLang serves under now and, with a LoRA
        snapshot, the adapter in ``lora_path``.

        After a disk update SGLang's ``served_model_name`` is the loaded path, and it
        reads a ``model`` it does not serve as ``base:adapter`` when it holds a colon: a
        client's ``qwen:7b`` would then ask for an adapter ``7b`` that was never loaded.
        """
        if path not in _GENERATION_PATHS:
            return body
        prepared = dict(body)
        if self._served_model is not None:
            prepared["model"] = self._served_model
        if self._lora.active is not None:
            prepared["lora_path"] = self._lora.active
        return prepared

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        """``metadata.weight_version(s)`` on ``/v1`` answers, ``meta_info`` on
        ``/generate``; the launch value and the label of unknown weights name none."""
        return [
            v for v in weight_versions(payload) if v not in (self._launch_version, UNKNOWN_VERSION)
        ]
