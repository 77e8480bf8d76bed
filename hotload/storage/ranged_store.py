"""What every backend derives from ``stat`` and ``get_range``: ``size`` and ``download``.

A resumable, parallel download is the same algorithm whatever answers the ranged reads,
so it is written once here; a backend supplies only its own ``stat`` and ``get_range``
(which already retry, hence the single attempt per part below).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from hotload.retry import NO_RETRY
from hotload.storage.download import ranged_download
from hotload.storage.protocol import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_SIZE,
    DownloadResult,
    ObjectInfo,
    ProgressCallback,
)


class RangedReadStore(ABC):
    """Base of the backends: ``size`` and ``download`` on top of ``stat``/``get_range``."""

    @property
    @abstractmethod
    def url(self) -> str:
        """The bucket URL (no credentials in it)."""

    @abstractmethod
    async def stat(self, key: str) -> ObjectInfo:
        """Size and version tag of one object."""

    @abstractmethod
    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object, retried by the backend."""

    async def size(self, key: str) -> int:
        return (await self.stat(key)).size

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
        info = await self.stat(key)

        async def read_range(start: int, end: int) -> bytes:
            return await self.get_range(key, start, end)

        return await ranged_download(
            key=key,
            info=info,
            read_range=read_range,
            dest=dest,
            expected_size=expected_size,
            part_size=part_size,
            concurrency=concurrency,
            retry=NO_RETRY,  # get_range already retries
            progress=progress,
            url=self.url,
            partial=partial,
        )
