"""Adapter for SGLang 0.5.23, as the released server behaves (docs/engines.md, table 1-8).

- Full/Incremental: ``POST /update_weights_from_disk`` with ``model_path``,
  ``weight_version`` = identity, ``flush_cache: false`` and ``abort_all_requests: false``.
  Unpaused it waits for in-flight generations; paused it applies at once. Anything but
  ``success: true`` is :class:`EngineRejected`, and the weights are then unknown: 0.5.23
  "rolls back" by re-reading the new path (``rollback_trusted`` is False), and it updates
  the version ``/model_info`` reports only on success.
- LoRA: ``POST /load_lora_adapter {lora_name, lora_path, pinned}``, unload the previous
  adapter, record the identity with ``POST /update_weight_version``; requests name the
  adapter in ``lora_path``. Needs ``--enable-lora``.
- Pause: ``POST /pause_generation {"mode": "in_place"}``, or ``"retract"`` when the cache
  policy is ``all`` (a flush is refused while an ``in_place`` batch runs, allowed once
  requests are retracted); ``resume`` then flushes before ``/continue_generation``.
  ``PauseMode.WAIT`` sends nothing: an unpaused update already waits.
- Cache without a pause: ``POST /flush_cache?timeout=S`` (waits up to S s for idle). The
  radix cache is shared by prefix, not by session: ``none`` and ``new_session`` keep it.
- Health: ``GET /ready`` (``/health`` runs a generation a pause holds for 20 s, then 503).
- Requests: after a disk update SGLang serves under the loaded path
  (``served_model_name``), so generation requests name that path as their ``model``.
- Keys: admin routes carry the admin key (else the API key), ``/model_info`` the API key.
- Identity: ``/model_info`` ``weight_version``; the launch value (``"default"``) means
  nothing hotload loaded. Per response: ``metadata.weight_version(s)`` on ``/v1``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import httpx

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.admin_http import json_object, response_detail
from hotload.engines.engine_checksum import ChecksumLedger
from hotload.engines.http_adapter import HttpEngine
from hotload.engines.identity_fields import weight_versions
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

    health_path: ClassVar[str] = "/ready"

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
        """``/model_info`` takes the API key only (admin routes: the admin key)."""
        self._load_timeout = load_timeout
        self._flush_timeout = flush_timeout
        self._launch_version = launch_version
        self._checksums = ChecksumLedger("SGLang") if verify_digest else None
        """``spec.engine.verifyDigest``: each Full/Incremental load is checked against the
        engine's own checksum the same snapshot gave before."""
        self._lora = LoraSlot(self._http, engine="SGLang", unload_path="/unload_lora_adapter")
        self._paused_for_flush = False
        """Paused in ``retract`` mode for the ``all`` policy: flush before continuing."""
        self._flushed = False
        """The flush of the ``all`` policy already happened during this swap's pause."""
        self._served_model: str | None = None
        """SGLang's ``served_model_name`` now: it becomes the loaded path on every disk
        update (``tokenizer_manager._update_model_path_info``)."""

    @property
    def kind(self) -> EngineKind:
        return EngineKind.SGLANG

    @property
    def rollback_trusted(self) -> bool:
        """False: a failed update leaves the weights part new, part old (see module doc)."""
        return False

    async def report(self, *, digest: bool = False) -> EngineReport:
        """The weight version it serves (None for its launch value). No instance id: a
        restart shows as the version returning to its launch value. No digest: SGLang's
        checksums are of its own fused parameters, not the snapshot's tensors."""
        return EngineReport(await self.served_identity(), None, None)

    @property
    def active_lora(self) -> str | None:
        """The adapter name requests are routed to, if a LoRA snapshot is served."""
        return self._lora.active

    async def served_identity(self) -> str | None:
        """``weight_version`` of ``/model_info``; None for the launch value."""
        version = (await self._model_info()).get("weight_version")
        if version in (None, "", self._launch_version):
            return None
        return str(version)

    async def _model_info(self) -> dict[str, Any]:
        response = await self._info.request("GET", "/model_info")
        if response.status_code != 200:
            raise EngineUnavailable(
                "SGLang /model_info failed", url=self.base_url, status=response.status_code
            )
        return json_object(response)

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
            self._served_model = str(path)
            await self._lora.clear()
            if self._checksums is not None:
                self._checksums.check(identity, await self.weights_checksum(), url=self.base_url)
            return
        detail = str(body.get("message") or response_detail(response))
        raise EngineRejected(
            f"SGLang refused the weights (what it serves now is unknown): {detail}",
            url=self.base_url,
            identity=identity,
            path=str(path),
            status=response.status_code,
        )

    async def _load_lora(self, path: Path, identity: Identity) -> None:
        if self._lora.active == identity:
            # Loading it again (a reload after a failed load or a restart): SGLang refuses
            # a name it holds ("already exists"), so it goes first.
            await self._lora.clear()
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
        drops it (they re-prefill on the new weights) and lets the flush run."""
        self._flushed = False
        if mode is PauseMode.WAIT:
            return  # an unpaused update already waits for in-flight generations
        flush = cache_policy is KvCachePolicy.ALL
        engine_mode = "retract" if flush else "in_place"
        response = await self._http.request("POST", "/pause_generation", json={"mode": engine_mode})
        if response.status_code != 200:
            raise EngineBusy(
                f"SGLang did not pause: {response_detail(response)}",
                url=self.base_url,
                status=response.status_code,
            )
        self._paused_for_flush = flush

    async def resume(self) -> None:
        """Continue generation; after a ``retract`` pause, flush the cache first (the only
        moment 0.5.23 accepts a flush under traffic)."""
        if self._paused_for_flush:
            self._paused_for_flush = False
            self._flushed = await self._flush(timeout=self._flush_timeout)
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
        ``/generate``; the launch value names no snapshot."""
        return [v for v in weight_versions(payload) if v != self._launch_version]
