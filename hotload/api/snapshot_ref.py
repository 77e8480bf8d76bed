"""Snapshot kinds, cache policies and the small reference a deployment's status carries."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field

from hotload.api._base import ApiStatusModel

#: DNS-1123 subdomain: the identity is the object name and one safe path segment.
IDENTITY_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
IDENTITY_MAX_LENGTH: Final = 253

Identity = Annotated[
    str, Field(min_length=1, max_length=IDENTITY_MAX_LENGTH, pattern=IDENTITY_PATTERN)
]


class SnapshotKind(StrEnum):
    """Spelled the same in the CRD, the manifest and the target."""

    FULL = "Full"
    INCREMENTAL = "Incremental"
    LORA = "LoRA"


class KvCachePolicy(StrEnum):
    """What happens to the prompt (KV) cache after a swap."""

    ALL = "all"
    """Reset everything: nothing computed with the old weights is reused."""
    NONE = "none"
    """Keep the whole cache."""
    NEW_SESSION = "new_session"
    """Keep it for running sessions; new sessions start fresh."""


class SnapshotRef(ApiStatusModel):
    """A snapshot as a deployment's status names it: enough for a sidecar to act alone."""

    identity: Identity
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
