"""Snapshot kinds, cache policies and the small reference a deployment's status carries."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field, field_serializer

from hotload.api._base import ApiStatusModel
from hotload.api.identity import ValidIdentity
from hotload.api.kinds import KvCachePolicy, SnapshotKind
from hotload.api.switch import switch_time


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
    switch_at: datetime | None = None
    """Coordinated switch only (the target): the moment every replica swaps to this
    snapshot, by its own clock (RFC 3339 UTC, ms). Committed by the publisher, or the
    deadline presumed by the operator when no decision came. A replica staged later, or
    told later, swaps at once (Late)."""
    switch_by: datetime | None = None
    """Coordinated switch with onStagingTimeout Follow, before a commit: the deadline at
    which replicas switch anyway if no commit reaches them (the publisher died)."""

    @field_serializer("switch_at", "switch_by", when_used="json-unless-none")
    def _to_the_millisecond(self, moment: datetime) -> str:
        return switch_time(moment)

    def same_snapshot(self, other: SnapshotRef | None) -> bool:
        """The same snapshot (identity, step, kind, cache policy), whatever the switch says:
        a commit arriving for a target is not a new target."""
        return other is not None and self.model_dump(
            exclude={"switch_at", "switch_by"}
        ) == other.model_dump(exclude={"switch_at", "switch_by"})

    def outranks(self, other: SnapshotRef) -> bool:
        """True when this snapshot comes after ``other``: by step, and a Full beats a delta."""
        return snapshot_order(self.step, self.kind) > snapshot_order(other.step, other.kind)


def snapshot_order(step: int, kind: SnapshotKind) -> tuple[int, int]:
    """Sort key of snapshots: step first; at equal steps a Full (or LoRA) outranks a delta."""
    return (step, 0 if kind is SnapshotKind.INCREMENTAL else 1)
