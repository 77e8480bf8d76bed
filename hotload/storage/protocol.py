"""The one storage interface the sidecar, publisher and tests use, whatever the backend.

Every operation is async; keys are relative to the bucket URL's prefix (see
``bucket_url.check_key``). Errors are always ours: ``NotFound``, ``AccessDenied``,
``StorageUnavailable`` (transient, already retried with backoff by the read operations),
``ObjectTooLarge`` (``get`` over its cap) and ``ConfigError`` for a malformed key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

#: Cap of :meth:`Storage.get` unless the caller says otherwise (manifests are small).
DEFAULT_GET_LIMIT: Final = 16 * 1024 * 1024
#: Ranged-read part size of :meth:`Storage.download`.
DEFAULT_PART_SIZE: Final = 8 * 1024 * 1024
#: Parallel ranged reads of one :meth:`Storage.download`.
DEFAULT_CONCURRENCY: Final = 8

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done_bytes, total_bytes)`` after each part (and once at the start
with the bytes a resumed download already had)."""


@dataclass(frozen=True)
class ObjectInfo:
    """What ``stat`` and ``list`` say about one object."""

    key: str
    """Relative to the bucket URL's prefix."""
    size: int
    etag: str | None = None
    """The backend's version tag (S3 ETag; for file://, size and mtime): a resumed
    download starts over when it changed."""
    modified: datetime | None = None


@dataclass(frozen=True)
class DownloadResult:
    """What one :meth:`Storage.download` did."""

    key: str
    path: Path
    size: int
    fetched_bytes: int
    """Bytes read from storage by this call."""
    resumed_bytes: int
    """Bytes a previous, interrupted download had already written (not read again)."""
    parts: int
    """Ranged reads this call made."""


@runtime_checkable
class Storage(Protocol):
    """An object store rooted at one bucket URL (``file://`` or ``s3://``)."""

    @property
    def url(self) -> str:
        """The bucket URL this storage reads and writes (no credentials in it)."""
        ...

    async def get(self, key: str, *, max_bytes: int = DEFAULT_GET_LIMIT) -> bytes:
        """A small object whole; ``ObjectTooLarge`` when it exceeds ``max_bytes``."""
        ...

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object (end exclusive, clamped to the size)."""
        ...

    async def stat(self, key: str) -> ObjectInfo:
        """Size and version tag of one object."""
        ...

    async def size(self, key: str) -> int:
        """The object's size in bytes."""
        ...

    async def download(
        self,
        key: str,
        dest: Path,
        *,
        expected_size: int | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        progress: ProgressCallback | None = None,
        partial: Path | None = None,
    ) -> DownloadResult:
        """Fetch ``key`` to ``dest`` with parallel ranged reads.

        Writes into ``dest.part`` and records finished parts in ``dest.part.json`` (or,
        given ``partial``, a directory of this download's own, into ``data`` and
        ``state.json`` there); a download interrupted (even by a killed process) resumes
        from there when the object is unchanged; a cancelled one stops at its next part
        and returns only once no thread writes its files. ``dest`` appears (atomic
        rename) only when every byte is there. The caller still verifies the file's
        hash: storage checks sizes only.
        ``expected_size`` (from the manifest) is checked before anything is fetched.
        """
        ...

    async def put(self, key: str, data: bytes) -> None:
        """Write an object whole (atomic for file://: temp file, fsync, rename)."""
        ...

    async def put_file(self, key: str, src: Path) -> None:
        """Upload a local file (multipart for large ones on s3://; atomic for file://)."""
        ...

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""
        ...

    async def delete(self, key: str) -> None:
        """Remove an object; removing a missing one is not an error."""
        ...

    async def aclose(self) -> None:
        """Release threads and connections."""
        ...
