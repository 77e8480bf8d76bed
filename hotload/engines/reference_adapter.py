"""Adapter for hotload's own reference engine (``hotload engine reference``).

Its admin API is ours (see docs/engines.md): ``POST /admin/load {path, identity, kind}``,
``POST /admin/apply_delta {path, identity}`` (a delta patched into the live weights),
both with an optional ``cache_policy`` applied at the swap, ``/admin/pause {mode}``,
``/admin/resume``, ``/admin/reset_cache {policy}``, ``GET /admin/identity``, ``GET /health``.
A 4xx on load means the weights were refused (the old ones keep serving):
``EngineRejected``; 409 and 503 mean busy.

Capabilities (:mod:`hotload.engines.capabilities`): it patches a delta in place
(:meth:`ReferenceEngine.apply_delta`) and swaps between two tokens
(:meth:`ReferenceEngine.load_between_tokens`): it reads and checks a load beside serving
and takes its model lock only to write the changed elements; and it stages a load for a
coordinated switch (:meth:`ReferenceEngine.stage`, ``POST /admin/stage``) and swaps it in
at an instant (:meth:`ReferenceEngine.switch_at`, ``POST /admin/switch``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.admin_http import json_object, response_detail
from hotload.engines.http_adapter import HttpEngine
from hotload.engines.identity_fields import reference_identities
from hotload.engines.protocol import EngineReport, PauseMode
from hotload.errors import (
    DeltaNotApplicable,
    EngineBusy,
    EngineError,
    EngineRejected,
    HotloadError,
)

DEFAULT_LOAD_TIMEOUT = 600.0


class ReferenceEngine(HttpEngine):
    """Drives the reference engine over HTTP."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        *,
        api_key: str | None = None,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
    ) -> None:
        super().__init__(base_url, client, api_key=api_key)
        self._load_timeout = load_timeout

    @property
    def kind(self) -> EngineKind:
        return EngineKind.REFERENCE

    @property
    def rollback_trusted(self) -> bool:
        """It reads and validates everything before a served weight changes."""
        return True

    async def served_identity(self) -> str | None:
        return (await self.report()).identity

    async def report(self, *, digest: bool = False) -> EngineReport:
        """``GET /admin/identity`` (``?digest=true`` adds the weights' tensor-set digest).
        Its launch weights (``init``, never loaded by a sidecar) report no identity. The
        generation is its count of swaps (every load and patch, whoever sent it)."""
        params = {"digest": "true"} if digest else None
        response = await self._http.request("GET", "/admin/identity", params=params)
        self._raise_for(response, "identity")
        body = json_object(response)
        identity, instance, value = (
            body.get("identity"),
            body.get("instance_id"),
            body.get("digest"),
        )
        swaps, paused = body.get("swaps"), body.get("paused")
        loaded = body.get("loaded", True) is not False
        return EngineReport(
            identity if isinstance(identity, str) and loaded else None,
            instance if isinstance(instance, str) else None,
            value if isinstance(value, str) else None,
            generation=str(swaps) if isinstance(swaps, int) else None,
            paused=paused if isinstance(paused, bool) else None,
        )

    async def load_weights(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        await self.load_between_tokens(path, identity, kind=kind, cache_policy=None)

    async def load_between_tokens(
        self,
        path: Path,
        identity: Identity,
        *,
        kind: SnapshotKind,
        cache_policy: KvCachePolicy | None,
    ) -> None:
        """``POST /admin/load``: read and checked beside serving, swapped between two
        tokens with ``cache_policy`` applied in the same step (None keeps the cache)."""
        body: dict[str, Any] = {"path": str(path), "identity": identity, "kind": kind.value}
        if cache_policy is not None:
            body["cache_policy"] = cache_policy.value
        response = await self._http.request(
            "POST", "/admin/load", json=body, timeout=self._load_timeout
        )
        self._raise_for(response, "load", identity=identity, path=str(path))

    async def stage(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        """``POST /admin/stage``: read, checked and built beside serving, held for
        :meth:`switch_at` (a coordinated switch)."""
        body = {"path": str(path), "identity": identity, "kind": kind.value}
        response = await self._http.request(
            "POST", "/admin/stage", json=body, timeout=self._load_timeout
        )
        self._raise_for(response, "stage", identity=identity, path=str(path))

    async def staged_identity(self) -> Identity | None:
        """``staged`` of ``GET /admin/identity``."""
        response = await self._http.request("GET", "/admin/identity")
        self._raise_for(response, "identity")
        staged = json_object(response).get("staged")
        return staged if isinstance(staged, str) else None

    async def switch_at(
        self, identity: Identity, at: datetime | None, *, cache_policy: KvCachePolicy | None
    ) -> datetime:
        """``POST /admin/switch``: the engine swaps at ``at`` by its own clock and answers
        with the instant it did."""
        body: dict[str, Any] = {"identity": identity, "at": at.timestamp() if at else None}
        if cache_policy is not None:
            body["cache_policy"] = cache_policy.value
        wait = max(0.0, at.timestamp() - time.time()) if at is not None else 0.0
        response = await self._http.request(
            "POST", "/admin/switch", json=body, timeout=self._load_timeout + wait
        )
        self._raise_for(response, "switch", identity=identity)
        took = json_object(response).get("at")
        if not isinstance(took, int | float):
            raise EngineRejected("the switch's answer names no instant", url=self.base_url)
        return datetime.fromtimestamp(took, UTC)

    async def apply_delta(
        self, path: Path, identity: Identity, *, cache_policy: KvCachePolicy | None = None
    ) -> None:
        """Patch the served weights with the verified delta at ``path``, in place.

        ``DeltaNotApplicable`` when the engine cannot (the layout changed): load the
        rebuilt directory instead; ``EngineRejected`` when it refused the delta. Either
        way the old weights serve on.
        """
        body: dict[str, Any] = {"path": str(path), "identity": identity}
        if cache_policy is not None:
            body["cache_policy"] = cache_policy.value
        response = await self._http.request(
            "POST", "/admin/apply_delta", json=body, timeout=self._load_timeout
        )
        if response.status_code == 422 and json_object(response).get("fallback") == "load":
            raise DeltaNotApplicable(
                f"reference engine cannot patch in place: {response_detail(response)}",
                url=self.base_url,
                identity=identity,
                path=str(path),
            )
        self._raise_for(response, "apply_delta", identity=identity, path=str(path))

    async def pause(self, mode: PauseMode, *, cache_policy: KvCachePolicy | None = None) -> None:
        response = await self._http.request("POST", "/admin/pause", json={"mode": mode.value})
        self._raise_for(response, "pause")

    async def resume(self) -> None:
        response = await self._http.request("POST", "/admin/resume", json={})
        self._raise_for(response, "resume")

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        response = await self._http.request(
            "POST", "/admin/reset_cache", json={"policy": policy.value}
        )
        self._raise_for(response, "reset_cache", policy=policy.value)

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        return reference_identities(payload)

    def _raise_for(self, response: httpx.Response, operation: str, **context: Any) -> None:
        status = response.status_code
        if status < 300:
            return
        detail = response_detail(response)
        context = {"url": self.base_url, "operation": operation, "status": status, **context}
        error: type[HotloadError]
        if status in (409, 503):
            error = EngineBusy
        elif 400 <= status < 500:
            error = EngineRejected
        else:
            error = EngineError
        raise error(f"reference engine refused {operation}: {detail}", **context)
