"""Snapshot kinds, cache policies and the identity pattern: plain names, no pydantic.

Kept apart from the models (``snapshot_ref``) so that the snapshot codec and its CLI,
which need only these, do not pay for building any pydantic model.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, TypeAlias

#: DNS-1123 subdomain: the identity is the object name and one safe path segment.
IDENTITY_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
IDENTITY_MAX_LENGTH: Final = 253

Identity: TypeAlias = str
"""A snapshot's identity: its PolicySnapshot's name, its bucket prefix and its manifest's
``identity`` (a DNS-1123 subdomain, :data:`IDENTITY_PATTERN`). Every signature that takes
or returns one says ``Identity``; where a replica's served snapshot and its target appear
together they are ``served_identity`` and ``target_identity``. The API models validate it
where it enters (``hotload.api.identity.ValidIdentity``)."""


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
