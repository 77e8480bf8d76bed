"""Reason words shared by sidecar, operator and CLI (CONTRACTS.md, "Ordering, Ready, fallback").

They are the ``reason`` of pod annotations, conditions and Events. The error classes in
``hotload.errors`` carry the same words, so ``err.reason`` can be written as is.
"""

from __future__ import annotations

from typing import Final

# Breaks: ChainValid=False, deployment Degraded, an Event.
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
TRANSIENT_REASONS: Final = frozenset({STORAGE_UNAVAILABLE, NOT_FOUND, ENGINE_BUSY})

# That replica is Failed; the chain is fine.
ENGINE_REJECTED: Final = "EngineRejected"

# Condition reasons.
ROLLED: Final = "Rolled"
SUPERSEDED: Final = "Superseded"
ROLLING: Final = "Rolling"
STALE: Final = "Stale"
VERIFIED: Final = "Verified"
NOT_LOADED: Final = "NotLoaded"
