"""A snapshot's identity as the pydantic models validate it (no model is built here).

The manifest (``hotload.snapshot``) and the API models share this one definition; a
process that only decodes snapshots imports it without paying for any CRD model.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hotload.api.kinds import IDENTITY_MAX_LENGTH, IDENTITY_PATTERN, Identity

ValidIdentity = Annotated[
    Identity, Field(min_length=1, max_length=IDENTITY_MAX_LENGTH, pattern=IDENTITY_PATTERN)
]
"""An :data:`~hotload.api.kinds.Identity`, checked: non-empty, a DNS-1123 subdomain."""
