"""Reason words shared by sidecar, operator and CLI (CONTRACTS.md, "Ordering, Ready, fallback"
and "Decisions ... States and reasons").

They are the ``reason`` of pod annotations, conditions and Events. The error classes in
``hotload.errors`` carry the same words, so ``err.reason`` can be written as is. Every
reason the sidecar may write as a failure has a class (:class:`ReasonClass`) that says
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
TRANSIENT_REASONS: Final = frozenset(
    {STORAGE_UNAVAILABLE, NOT_FOUND, ENGINE_BUSY, ENGINE_UNAVAILABLE}
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
