"""Fault injection for the demo and the cross-region tests: a bucket that stores the delta
data of chosen snapshots with one byte flipped, the way a bad disk or a truncated copy
would leave it. Everything else (the manifest, with the true hashes, included) is stored
as given, so every replica finds the damage when it verifies, and the chain breaks there.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

from hotload.publish.buckets import BucketOpener, open_region_bucket
from hotload.publish.region_client import RegionBucket
from hotload.snapshot import MANIFEST_NAME
from hotload.storage import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GET_LIMIT,
    DEFAULT_PART_SIZE,
    DownloadResult,
    ObjectInfo,
    ProgressCallback,
    Storage,
)

#: Where the damage goes: past any header, well inside the data.
FLIP_AT_FRACTION = 0.5


def flip_one_byte(path: Path) -> None:
    with path.open("r+b") as handle:
        size = handle.seek(0, 2)
        offset = int(size * FLIP_AT_FRACTION)
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


class CorruptingBucket:
    """A :class:`~hotload.storage.Storage` that damages one delta file of each snapshot
    named in ``identities`` on its way up; every other call goes to ``inner`` unchanged."""

    def __init__(self, inner: Storage, identities: Collection[str]) -> None:
        self._inner = inner
        self._identities = set(identities)
        self.damaged: list[str] = []

    @property
    def url(self) -> str:
        return self._inner.url

    async def put_file(self, key: str, src: Path) -> None:
        identity, _, name = key.partition("/")
        if identity in self._identities and name != MANIFEST_NAME and "delta" in name:
            self._identities.discard(identity)
            with tempfile.TemporaryDirectory(prefix="hotload-corrupt-") as scratch:
                damaged = Path(scratch) / src.name
                shutil.copyfile(src, damaged)
                flip_one_byte(damaged)
                await self._inner.put_file(key, damaged)
            self.damaged.append(key)
            return
        await self._inner.put_file(key, src)

    async def get(self, key: str, *, max_bytes: int = DEFAULT_GET_LIMIT) -> bytes:
        return await self._inner.get(key, max_bytes=max_bytes)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await self._inner.get_range(key, start, end)

    async def stat(self, key: str) -> ObjectInfo:
        return await self._inner.stat(key)

    async def size(self, key: str) -> int:
        return await self._inner.size(key)

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
        return await self._inner.download(
            key,
            dest,
            expected_size=expected_size,
            part_size=part_size,
            concurrency=concurrency,
            progress=progress,
            partial=partial,
        )

    async def put(self, key: str, data: bytes) -> None:
        await self._inner.put(key, data)

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        return await self._inner.list(prefix)

    async def delete(self, key: str) -> None:
        await self._inner.delete(key)

    async def aclose(self) -> None:
        await self._inner.aclose()


def corrupting_opener(identities: Collection[str]) -> tuple[BucketOpener, list[CorruptingBucket]]:
    """A bucket opener for the publisher that damages the named snapshots' deltas, and the
    buckets it opened (their ``damaged`` keys say what was hit)."""
    opened: list[CorruptingBucket] = []

    def open_bucket(bucket: RegionBucket) -> Storage:
        wrapped = CorruptingBucket(open_region_bucket(bucket), identities)
        opened.append(wrapped)
        return wrapped

    return open_bucket, opened
