"""Every reason word of hotload: failures, conditions and Events (CONTRACTS.md, "Ordering,
Ready, fallback" and "Decisions ... States and reasons").

They are the ``reason`` of pod annotations, conditions and Events; no other module spells
one (the operator, the sidecar, the publisher and the CLI import them from here). The
error classes in ``hotload.errors`` carry the same words, so ``err.reason`` can be written
as is. Every reason the sidecar may write as a failure has a class (:class:`ReasonClass`) that says
what it means for the rest of the fleet:

- **chain-breaking**: the bucket's snapshot is bad (the operator marks it
  ``ChainValid=False`` and the deployment ``Degraded``). The sidecar reports one only
  after a replay from the last Full, fetched again, failed the same way: a report means
  the bucket is bad, not one replica's staging.
- **transient**: retried with backoff; the state stays ``Loading`` (never written as a
  ``Failed`` reason, but counted in ``hotload_failures_total`` and shown in ``/status``).
- **replica-only**: that replica is ``Failed``; the snapshot and the chain are fine.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class ReasonClass(StrEnum):
    """What a failure reason means beyond the replica that saw it."""

    CHAIN_BREAKING = "ChainBreaking"
    TRANSIENT = "Transient"
    REPLICA = "Replica"


# Chain-breaking: ChainValid=False, deployment Degraded, an Event.
CHECKSUM_MISMATCH: Final = "ChecksumMismatch"
CHAIN_BROKEN: Final = "ChainBroken"
MANIFEST_INVALID: Final = "ManifestInvalid"
DECODE_FAILED: Final = "DecodeFailed"
CHAIN_BREAKING_REASONS: Final = frozenset(
    {CHECKSUM_MISMATCH, CHAIN_BROKEN, MANIFEST_INVALID, DECODE_FAILED}
)

# Transient: retried with backoff, never a break.
STORAGE_UNAVAILABLE: Final = "StorageUnavailable"
NOT_FOUND: Final = "NotFound"
ENGINE_BUSY: Final = "EngineBusy"
ENGINE_UNAVAILABLE: Final = "EngineUnavailable"
"""The engine does not answer (restarting, overloaded): retried."""
DISK_FULL: Final = "DiskFull"
"""The staging volume has no space left (``ENOSPC``; a Memory ``emptyDir`` at its size):
the partial files are removed and the load retried with backoff until there is room."""
OUT_OF_MEMORY: Final = "OutOfMemory"
"""An allocation failed while fetching or rebuilding (memory pressure): retried."""
FOREIGN_LOAD: Final = "ForeignLoad"
"""The engine took a load its sidecar did not send (its generation moved under the name it
serves): re-verified by its digest, else the last verified snapshot is reloaded."""
ENGINE_PAUSED: Final = "EnginePaused"
"""The engine was found paused outside its sidecar's swaps (someone else paused it): the
sidecar resumes it."""
TRANSIENT_REASONS: Final = frozenset(
    {
        STORAGE_UNAVAILABLE,
        NOT_FOUND,
        ENGINE_BUSY,
        ENGINE_UNAVAILABLE,
        DISK_FULL,
        OUT_OF_MEMORY,
        FOREIGN_LOAD,
        ENGINE_PAUSED,
    }
)

# Replica-only: that replica is Failed; the chain is fine.
ENGINE_REJECTED: Final = "EngineRejected"
"""The engine refused the weights (for a ``rollback_trusted`` engine it keeps the old
ones; otherwise the sidecar reloads the served snapshot)."""
ENGINE_ERROR: Final = "EngineError"
"""The engine answered a load with a server error."""
DIGEST_MISMATCH: Final = "DigestMismatch"
"""After a swap the engine's digest of its weights differs from the verified snapshot's:
it loaded something else (the sidecar reloads the served snapshot)."""
TARGET_INCONSISTENT: Final = "TargetInconsistent"
"""The target the sidecar was given disagrees with the snapshot's manifest (identity,
kind, previous link): a fault of the target, not of the snapshot's bytes or chain, so it
never marks ``ChainValid=False`` (CONTRACTS.md, "Target faults are not snapshot faults")."""
ACCESS_DENIED: Final = "AccessDenied"
"""The bucket refused the replica's credentials."""
STORAGE_REJECTED: Final = "StorageRejected"
"""The store refused a request for another reason than access."""
CONFIG_INVALID: Final = "ConfigInvalid"
"""A setting of the deployment or the pod is missing or malformed."""
INTERNAL_ERROR: Final = "InternalError"
"""An unexpected exception in a load, after it was retried as transient up to a cap."""
REPLICA_REASONS: Final = frozenset(
    {
        ENGINE_REJECTED,
        ENGINE_ERROR,
        DIGEST_MISMATCH,
        TARGET_INCONSISTENT,
        ACCESS_DENIED,
        STORAGE_REJECTED,
        CONFIG_INVALID,
        INTERNAL_ERROR,
    }
)

REASON_CLASSES: Final[Mapping[str, ReasonClass]] = {
    **{reason: ReasonClass.CHAIN_BREAKING for reason in CHAIN_BREAKING_REASONS},
    **{reason: ReasonClass.TRANSIENT for reason in TRANSIENT_REASONS},
    **{reason: ReasonClass.REPLICA for reason in REPLICA_REASONS},
}
"""Every failure reason the sidecar writes, with its class."""


def reason_class(reason: str) -> ReasonClass:
    """The class of a failure reason; a word we do not know concerns only its replica."""
    return REASON_CLASSES.get(reason, ReasonClass.REPLICA)


# Condition reasons.
ROLLED: Final = "Rolled"
SUPERSEDED: Final = "Superseded"
ROLLING: Final = "Rolling"
STALE: Final = "Stale"
VERIFIED: Final = "Verified"
NOT_LOADED: Final = "NotLoaded"
"""``SnapshotReady=False``: the engine serves nothing verified (before the first load, or
while a restarted engine is reloaded from staging)."""
PENDING: Final = "Pending"
"""A snapshot that is not (yet) the target."""
CHAIN_INVALID: Final = "ChainInvalid"
"""A snapshot whose chain is broken never turns Ready."""
CHAIN_COMPLETE: Final = "ChainComplete"
"""``ChainValid=True``: every link back to a Full is present and consistent."""
FULL_SNAPSHOT: Final = "FullSnapshot"
"""``ChainValid=True``: a complete snapshot starts a chain."""
PREVIOUS_MISSING: Final = "PreviousMissing"
"""``ChainValid`` Unknown (or False once a break is certain): a link is not in the cluster."""
NO_TARGET: Final = "NoTarget"
ROLLED_OUT: Final = "RolledOut"
REPLICAS_SERVING: Final = "ReplicasServing"
REPLICAS_UNAVAILABLE: Final = "ReplicasUnavailable"
SCALED_TO_ZERO: Final = "ScaledToZero"
REPLICAS_FAILED: Final = "ReplicasFailed"
HEALTHY: Final = "Healthy"
DEPLOYMENT_NOT_FOUND: Final = "DeploymentNotFound"
"""A PolicySnapshot whose RolloutDeployment does not exist (an orphan)."""

# Event reasons (the operator's Events on its deployments and snapshots).
TARGET_MOVED: Final = "TargetMoved"
TARGET_ROLLED_BACK: Final = "TargetRolledBack"
TARGET_CLEARED: Final = "TargetCleared"
RECOVERED: Final = "Recovered"
REPLICA_FAILED: Final = "ReplicaFailed"
SNAPSHOT_RETIRED: Final = "SnapshotRetired"
TARGET_REPAIRED: Final = "TargetRepaired"
"""Another writer changed ``status.targetSnapshot``; the operator restored its own."""
DELETION_HELD: Final = "DeletionHeld"
"""A deleted PolicySnapshot is kept (finalizer ``hotload.dev/served``) while it is the target
or served; it goes once neither holds."""
SWITCH_SCHEDULED: Final = "SwitchScheduled"
"""A coordinated switch time reached the target: committed by the publisher (Normal), or
the deadline presumed with ``onStagingTimeout: Follow`` (Warning)."""
SWITCH_ABORTED: Final = "SwitchAborted"
"""A coordinated switch was aborted (by the publisher, or presumed at the deadline with
``onStagingTimeout: Abort``): the target went back to what the fleet serves."""
