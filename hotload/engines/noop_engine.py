"""The ``noop`` engine: accepts every swap at once and serves nothing (scale runs only).

No HTTP at all, so one process can host hundreds of agents; it remembers what it was
told so the sidecar's reporting and the operator's ledger behave as with a real engine.
Its "weights" are the directory it was handed: its digest is the one the decoder recorded
in that rebuilt directory for that snapshot (a directory without one gives no digest), so
the sidecar's digest check and the operator's corroboration behave as with a real engine.
The path it is handed is the one an engine container sees (under the staging volume's
mount path); ``root`` says where mount paths lie on this host (the local runtime's pod
root), as for the sidecar itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.protocol import EngineReport, PauseMode
from hotload.mounts import host_path
from hotload.snapshot.decoder import read_rebuilt_record


class NoopEngine:
    """An engine that is always healthy and loads anything instantly."""

    def __init__(self, root: Path | None = None) -> None:
        self._root = root
        self._identity: Identity | None = None
        self._digest: str | None = None
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
        return EngineReport(self._identity, self._instance, self._digest if digest else None)

    async def load_weights(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        self.loads.append((path, identity, kind))
        self._identity = identity
        record = read_rebuilt_record(host_path(path.as_posix(), self._root))
        recorded = record.get("tensorDigest") if record is not None else None
        same = record is not None and record.get("identity") == identity
        self._digest = recorded if same and isinstance(recorded, str) else None

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
