"""``file://`` buckets: a directory on this host (the embedded default).

Writes are atomic (temp file in the same directory, fsync, rename, fsync of the
directory), so a reader — a sidecar, a replication job — never sees half an object.
Blocking file calls run in threads so the event loop keeps serving. A key is always a
file inside the bucket's directory: a symlink that leads out of it is refused
(``StorageRejected``), as an S3 bucket has no way to name another bucket's objects.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar

from hotload.errors import ObjectTooLarge, StorageRejected
from hotload.retry import RetryPolicy
from hotload.storage.bucket_url import BucketUrl, check_key, check_prefix
from hotload.storage.error_mapping import map_os_error
from hotload.storage.protocol import (
    DEFAULT_GET_LIMIT,
    ObjectInfo,
)
from hotload.storage.ranged_store import RangedReadStore
from hotload.storage.retry import STORAGE_RETRY, call_with_retry

T = TypeVar("T")

#: Temporary files of in-progress writes start with this; ``list`` never shows them.
TEMP_PREFIX: Final = ".hotload-tmp-"


class FileStorage(RangedReadStore):
    """A :class:`~hotload.storage.protocol.Storage` over a local directory."""

    def __init__(self, bucket: BucketUrl, *, retry: RetryPolicy | None = None) -> None:
        self._bucket = bucket
        self._root = bucket.root_path
        self._retry = retry or STORAGE_RETRY

    @property
    def url(self) -> str:
        return str(self._bucket)

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*check_key(key).split("/"))

    def _inside(self, key: str, path: Path) -> Path:
        """``path`` if it resolves inside the bucket (symlinks followed), else refused."""
        root = os.path.realpath(self._root)
        resolved = os.path.realpath(path)
        if resolved != root and not resolved.startswith(root + os.sep):
            raise StorageRejected(
                "the key leads out of the bucket (a symlink)", url=self.url, key=key
            )
        return path

    async def _run(self, func: Callable[[], T], *, key: str | None, operation: str) -> T:
        async def attempt() -> T:
            try:
                return await asyncio.to_thread(func)
            except OSError as err:
                raise map_os_error(err, url=self.url, key=key, operation=operation) from err

        return await call_with_retry(attempt, self._retry, what=f"{operation} {key or ''}")

    async def get(self, key: str, *, max_bytes: int = DEFAULT_GET_LIMIT) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            with open(self._inside(key, path), "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size > max_bytes:
                    raise ObjectTooLarge(
                        "object is over the size cap",
                        url=self.url,
                        key=key,
                        size=size,
                        max_bytes=max_bytes,
                    )
                return handle.read(max_bytes + 1)

        data = await self._run(read, key=key, operation="get")
        if len(data) > max_bytes:
            raise ObjectTooLarge(
                "object is over the size cap", url=self.url, key=key, max_bytes=max_bytes
            )
        return data

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        if start < 0 or end < start:
            raise ValueError(f"bad range [{start}, {end})")

        def read() -> bytes:
            fd = os.open(self._inside(key, path), os.O_RDONLY)
            try:
                chunks: list[bytes] = []
                offset = start
                while offset < end:
                    chunk = os.pread(fd, end - offset, offset)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    offset += len(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

        return await self._run(read, key=key, operation="get_range")

    def _info(self, key: str, path: Path) -> ObjectInfo:
        stat = self._inside(key, path).stat()
        if not path.is_file():
            raise IsADirectoryError(21, "not a regular file", str(path))
        return ObjectInfo(
            key=key,
            size=stat.st_size,
            etag=f"{stat.st_size:x}-{stat.st_mtime_ns:x}-{stat.st_ino:x}",
            modified=datetime.fromtimestamp(stat.st_mtime, UTC),
        )

    async def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        return await self._run(lambda: self._info(key, path), key=key, operation="stat")

    def _write_atomically(self, path: Path, fill: Callable[[int], None]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._inside(path.relative_to(self._root).as_posix(), path.parent)
        temp = path.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fill(fd)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        os.close(fd)
        try:
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def put(self, key: str, data: bytes) -> None:
        path = self._path(key)

        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

        await self._run(lambda: self._write_atomically(path, fill), key=key, operation="put")

    async def put_file(self, key: str, src: Path) -> None:
        path = self._path(key)

        def fill(fd: int) -> None:
            with open(src, "rb") as source, os.fdopen(os.dup(fd), "wb") as target:
                shutil.copyfileobj(source, target, 8 * 1024 * 1024)

        await self._run(lambda: self._write_atomically(path, fill), key=key, operation="put_file")

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._root.joinpath(*directory.split("/")) if directory else self._root

        def walk() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            if not start.is_dir():
                return found
            for dirpath, dirnames, filenames in os.walk(start):
                dirnames.sort()
                for name in filenames:
                    if name.startswith(TEMP_PREFIX):
                        continue
                    path = Path(dirpath, name)
                    key = path.relative_to(self._root).as_posix()
                    if not key.startswith(prefix):
                        continue
                    try:
                        found.append(self._info(key, path))
                    except FileNotFoundError:
                        continue  # deleted while we walked
                    except StorageRejected:
                        continue  # a symlink out of the bucket is no object of it
            return sorted(found, key=lambda info: info.key)

        return await self._run(walk, key=prefix, operation="list")

    async def delete(self, key: str) -> None:
        path = self._path(key)

        def remove() -> None:
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self._root and self._root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

        await self._run(remove, key=key, operation="delete")

    async def aclose(self) -> None:
        return None
