"""What the publisher tells whoever watches it (a progress display, a log, a test)."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from hotload.api import SnapshotKind
from hotload.publish.results import PublishResult, RegionResult


class Phase(StrEnum):
    """Where one region stands in one publish."""

    CATCHING_UP = "catching up"
    UPLOADING = "uploading"
    REPLICATING = "replicating"
    """Waiting for the home bucket's replication to bring this region its copy."""
    APPLYING = "applying"
    ROLLING = "rolling out"


class PublishObserver(Protocol):
    """Callbacks from the publisher's worker thread; they must return quickly."""

    def snapshot_encoded(
        self, identity: str, kind: SnapshotKind, step: int, stored_bytes: int, full_bytes: int
    ) -> None: ...

    def region_progress(
        self, context: str, phase: Phase, done: int | None = None, total: int | None = None
    ) -> None:
        """Bytes uploaded (UPLOADING) or replicas ready (ROLLING), when known."""
        ...

    def region_done(self, context: str, result: RegionResult) -> None: ...

    def publish_done(self, result: PublishResult) -> None: ...


class NullObserver:
    """Watches nothing."""

    def snapshot_encoded(
        self, identity: str, kind: SnapshotKind, step: int, stored_bytes: int, full_bytes: int
    ) -> None:
        return None

    def region_progress(
        self, context: str, phase: Phase, done: int | None = None, total: int | None = None
    ) -> None:
        return None

    def region_done(self, context: str, result: RegionResult) -> None:
        return None

    def publish_done(self, result: PublishResult) -> None:
        return None
