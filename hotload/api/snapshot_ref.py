"""Snapshot kinds, cache policies and the small reference a deployment's status carries."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hotload.api._base import ApiStatusModel
from hotload.api.identity import ValidIdentity
from hotload.api.kinds import KvCachePolicy, SnapshotKind


class SnapshotRef(ApiStatusModel):
    """A snapshot as a deployment's status names it: enough for a sidecar to act alone."""

    identity: ValidIdentity
    """The PolicySnapshot's name and its bucket prefix."""
    step: Annotated[int, Field(ge=0)]
    """The trainer's step; snapshots of one deployment are ordered by it."""
    kind: SnapshotKind
    """Full, Incremental or LoRA."""
    kv_cache_policy: KvCachePolicy
    """The cache policy resolved: the snapshot's own, else the deployment's default."""

    def outranks(self, other: SnapshotRef) -> bool:
        """True when this snapshot comes after ``other``: by step, and a Full beats a delta."""
        return snapshot_order(self.step, self.kind) > snapshot_order(other.step, other.kind)


def snapshot_order(step: int, kind: SnapshotKind) -> tuple[int, int]:
    """Sort key of snapshots: step first; at equal steps a Full (or LoRA) outranks a delta."""
    return (step, 0 if kind is SnapshotKind.INCREMENTAL else 1)
