"""Credentials for a bucket, handed down by the shell that read them.

Nothing below the shells reads ``os.environ``: the ``hotload sidecar`` shell (or a test)
builds a :class:`StorageCredentials` and passes it in. Its ``repr`` hides every field, so
a credential that reaches a log line or an error's context by mistake still says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_HIDDEN = "<redacted>"


@dataclass(frozen=True)
class StorageCredentials:
    """An S3 access key pair (plus a session token for temporary credentials)."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        token = ", session_token=<redacted>" if self.session_token else ""
        return f"StorageCredentials(access_key_id={_HIDDEN}, secret_access_key={_HIDDEN}{token})"

    __str__ = __repr__
