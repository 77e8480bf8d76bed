"""The ``noop`` engine: accepts every swap at once and serves nothing (scale runs only).

No HTTP at all, so one process can host hundreds of agents; it remembers what it was
told so the sidecar's reporting and the operator's ledger behave as with a real engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.protocol import EngineReport, PauseMode


class NoopEngine:
    """An engine that is always healthy and loads anything instantly."""

    def __init__(self) -> None:
        self._identity: Identity | None = None
        self._instance = uuid.uuid4().hex
        self._paused = False
        self.loads: list[tuple[Path, str, SnapshotKind]] = []
        """Every load it accepted, oldest first (tests and the scale benchmark read it)."""

    @property
    def kind(self) -> EngineKind:
        return EngineKind.NOOP

    @property
    def base_url(self) -> None:
        return None

    @property
    def rollback_trusted(self) -> bool:
        return True

    @property
    def paused(self) -> bool:
        return self._paused

    async def wait_ready(self, timeout: float) -> None:
        return None

    async def health(self) -> bool:
        return True

    async def served_identity(self) -> str | None:
        return self._identity

    async def report(self, *, digest: bool = False) -> EngineReport:
        return EngineReport(self._identity, self._instance, None)

    async def load_weights(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        self.loads.append((path, identity, kind))
        self._identity = identity

    async def pause(self, mode: PauseMode, *, cache_policy: KvCachePolicy | None = None) -> None:
        self._paused = True

    async def resume(self) -> None:
        self._paused = False

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        return None

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        return []

    async def aclose(self) -> None:
        return None
