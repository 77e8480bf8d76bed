"""Parallel ranged download into a partial file, with resume after a restart.

One algorithm for every backend: it needs only ``stat`` and ``get_range``. The object is
cut into parts of ``part_size``; ``concurrency`` workers fetch parts (each retried with
backoff), write them in place with ``pwrite``, fsync, and record the part as done in
``<partial>.json`` (written atomically). A process killed at any point leaves a state
that a later call resumes from, as long as the object's size and version tag are the
same; otherwise it starts over. ``dest`` appears by an atomic rename only when every part
is there. Hashes are the caller's job (the manifest knows them; storage does not).

The partial file is ``dest.part`` (and its record ``dest.part.json``) unless the caller
names a directory of its own for them (``partial``: ``data`` and ``state.json`` inside):
the sidecar keeps them outside the snapshot's directory, where a file may well be called
``x.part``, one directory per file. A cancelled download stops at its next part: the
parts being written finish, nothing else starts, and the call returns only once no
thread touches its files.

**No space left.** The partial file's whole size is reserved before any part is fetched
(``posix_fallocate``), so a volume without room for the object fails at once rather than
after most of it was read; a write that still finds no room (``ENOSPC``) ends the download
with :class:`~hotload.errors.DiskFull` (transient: retried once there is room) and removes
that download's partial file and record — a full volume keeps no half files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hotload.cancellation import run_in_thread
from hotload.errors import (
    ChecksumMismatch,
    ConfigError,
    ResourceExhausted,
    StorageUnavailable,
    resource_exhausted,
)
from hotload.retry import RetryPolicy
from hotload.space import reserve
from hotload.storage.protocol import DownloadResult, ObjectInfo, ProgressCallback
from hotload.storage.retry import call_with_retry

log = logging.getLogger(__name__)

PART_SUFFIX: Final = ".part"
STATE_SUFFIX: Final = ".part.json"
_STATE_VERSION: Final = 1

RangeReader = Callable[[int, int], Awaitable[bytes]]


@dataclass(frozen=True)
class _Plan:
    size: int
    etag: str | None
    part_size: int

    @property
    def parts(self) -> int:
        return (self.size + self.part_size - 1) // self.part_size

    def bounds(self, index: int) -> tuple[int, int]:
        start = index * self.part_size
        return start, min(self.size, start + self.part_size)


def part_path(dest: Path, partial: Path | None = None) -> Path:
    """Where the bytes of an unfinished download of ``dest`` are written."""
    return partial / "data" if partial is not None else dest.with_name(dest.name + PART_SUFFIX)


def state_path(dest: Path, partial: Path | None = None) -> Path:
    """Which parts of that file are done."""
    if partial is not None:
        return partial / "state.json"
    return dest.with_name(dest.name + STATE_SUFFIX)


@dataclass(frozen=True)
class _Paths:
    dest: Path
    part: Path
    state: Path


def _load_done(paths: _Paths, plan: _Plan, key: str) -> set[int]:
    """Parts a previous run finished, or nothing when its state does not match this object."""
    try:
        state = json.loads(paths.state.read_text())
        part_file_size = paths.part.stat().st_size
    except (OSError, ValueError):
        return set()
    if (
        not isinstance(state, dict)
        or state.get("version") != _STATE_VERSION
        or state.get("key") != key
        or state.get("size") != plan.size
        or state.get("etag") != plan.etag
        or state.get("part_size") != plan.part_size
        or part_file_size != plan.size
    ):
        return set()
    done = state.get("done")
    if not isinstance(done, list):
        return set()
    return {index for index in done if isinstance(index, int) and 0 <= index < plan.parts}


def _save_done(paths: _Paths, plan: _Plan, key: str, done: set[int]) -> None:
    state = {
        "version": _STATE_VERSION,
        "key": key,
        "size": plan.size,
        "etag": plan.etag,
        "part_size": plan.part_size,
        "done": sorted(done),
    }
    target = paths.state
    temp = _state_temp(paths)
    try:
        with open(temp, "w") as handle:
            json.dump(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _state_temp(paths: _Paths) -> Path:
    return paths.state.with_name(paths.state.name + ".tmp")


def _open_part_file(paths: _Paths, size: int, fresh: bool) -> int:
    """The partial file, ``size`` bytes long with all of them reserved on the volume."""
    path = paths.part
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if fresh else 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.ftruncate(fd, size)
        reserve(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def discard_partial(paths: _Paths, partial: Path | None) -> None:
    """Remove a download's partial file and its record (and its own directory)."""
    for path in (paths.part, paths.state, _state_temp(paths)):
        path.unlink(missing_ok=True)
    if partial is not None:
        with contextlib.suppress(OSError):
            partial.rmdir()


def _exhausted(
    err: BaseException, paths: _Paths, partial: Path | None, key: str
) -> ResourceExhausted | None:
    """The typed error when ``err`` means no space or memory (the partial files removed)."""
    mapped = resource_exhausted(err, key=key, path=str(paths.dest))
    if mapped is not None:
        discard_partial(paths, partial)
        log.warning("download stopped: %s", mapped.reason, extra={"key": key, "error": str(mapped)})
    return mapped


def _write_part(fd: int, offset: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
    os.fsync(fd)


def _finish(fd: int, paths: _Paths, partial: Path | None) -> None:
    os.fsync(fd)
    os.close(fd)
    os.replace(paths.part, paths.dest)
    paths.state.unlink(missing_ok=True)
    if partial is not None:
        with contextlib.suppress(OSError):
            partial.rmdir()
    dir_fd = os.open(paths.dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _whole_range(
    read_range: RangeReader, start: int, end: int, *, url: str, key: str
) -> Callable[[], Awaitable[bytes]]:
    """One read of ``[start, end)`` that a short answer fails as transient (so it is retried)."""

    async def read() -> bytes:
        data = await read_range(start, end)
        if len(data) != end - start:
            raise StorageUnavailable(
                "short ranged read", url=url, key=key, start=start, end=end, got=len(data)
            )
        return data

    return read


async def ranged_download(
    *,
    key: str,
    info: ObjectInfo,
    read_range: RangeReader,
    dest: Path,
    expected_size: int | None,
    part_size: int,
    concurrency: int,
    retry: RetryPolicy,
    progress: ProgressCallback | None,
    url: str,
    partial: Path | None = None,
) -> DownloadResult:
    """Fetch ``info.size`` bytes of ``key`` into ``dest`` (see the module docstring);
    ``partial`` is a directory of this download's own for its unfinished bytes (default:
    ``dest.part`` beside ``dest``)."""
    if part_size <= 0 or concurrency <= 0:
        raise ConfigError(
            "part_size and concurrency must be positive",
            part_size=part_size,
            concurrency=concurrency,
        )
    if expected_size is not None and info.size != expected_size:
        raise ChecksumMismatch(
            "the stored object's size differs from the manifest",
            url=url,
            key=key,
            expected_size=expected_size,
            size=info.size,
        )
    plan = _Plan(info.size, info.etag, part_size)
    paths = _Paths(dest, part_path(dest, partial), state_path(dest, partial))
    try:
        if plan.parts == 1:
            return await _single_read(key, plan, read_range, paths, partial, retry, progress, url)
        return await _parted(
            key, plan, read_range, paths, partial, concurrency, retry, progress, url
        )
    except (OSError, MemoryError) as err:
        mapped = await run_in_thread(_exhausted, err, paths, partial, key)
        if mapped is None:
            raise
        raise mapped from err


async def _parted(
    key: str,
    plan: _Plan,
    read_range: RangeReader,
    paths: _Paths,
    partial: Path | None,
    concurrency: int,
    retry: RetryPolicy,
    progress: ProgressCallback | None,
    url: str,
) -> DownloadResult:
    """An object of several parts, fetched in parallel and resumable (the module doc)."""
    dest = paths.dest
    await run_in_thread(dest.parent.mkdir, parents=True, exist_ok=True)
    done = await run_in_thread(_load_done, paths, plan, key)
    resumed = sum(plan.bounds(i)[1] - plan.bounds(i)[0] for i in done)
    fd = await run_in_thread(_open_part_file, paths, plan.size, not done)
    if not done:
        try:
            await run_in_thread(_save_done, paths, plan, key, done)
        except BaseException:
            os.close(fd)
            raise
    todo = [index for index in range(plan.parts) if index not in done]
    log.info(
        "download starting",
        extra={
            "url": url,
            "key": key,
            "size": plan.size,
            "parts": len(todo),
            "resumed_bytes": resumed,
        },
    )
    fetched = 0
    completed = resumed
    state_lock = asyncio.Lock()
    if progress is not None:
        progress(completed, plan.size)

    async def fetch(index: int) -> None:
        nonlocal fetched, completed
        start, end = plan.bounds(index)

        read = _whole_range(read_range, start, end, url=url, key=key)
        data = await call_with_retry(read, retry, what=f"get_range {key}")
        await run_in_thread(_write_part, fd, start, data)
        async with state_lock:
            done.add(index)
            fetched += len(data)
            completed += len(data)
            await run_in_thread(_save_done, paths, plan, key, set(done))
            if progress is not None:
                progress(completed, plan.size)

    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in todo:
        queue.put_nowait(index)

    async def worker() -> None:
        while True:
            try:
                index = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await fetch(index)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, max(1, len(todo)))):
                group.create_task(worker())
    except BaseException as err:
        # Every worker has returned (the task group waited, and each write in a thread
        # ran to its end): nothing uses the descriptor any more.
        os.close(fd)
        if isinstance(err, BaseExceptionGroup):
            first = err.exceptions[0]
            if isinstance(first, Exception):
                raise first from None
        raise
    await run_in_thread(_finish, fd, paths, partial)
    log.info(
        "download finished",
        extra={"url": url, "key": key, "size": plan.size, "fetched_bytes": fetched},
    )
    return DownloadResult(
        key=key,
        path=dest,
        size=plan.size,
        fetched_bytes=fetched,
        resumed_bytes=resumed,
        parts=len(todo),
    )


def _write_whole(paths: _Paths, data: bytes, partial: Path | None) -> None:
    """One part's bytes to ``dest``: written to the partial file, fsync'd, renamed (a
    reader never sees half of it); a previous run's resume record goes."""
    paths.dest.parent.mkdir(parents=True, exist_ok=True)
    paths.part.parent.mkdir(parents=True, exist_ok=True)
    paths.state.unlink(missing_ok=True)
    fd = os.open(paths.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        reserve(fd, len(data))
        _write_part(fd, 0, data)
    except BaseException:
        os.close(fd)
        paths.part.unlink(missing_ok=True)
        raise
    _finish(fd, paths, partial)


async def _single_read(
    key: str,
    plan: _Plan,
    read_range: RangeReader,
    paths: _Paths,
    partial: Path | None,
    retry: RetryPolicy,
    progress: ProgressCallback | None,
    url: str,
) -> DownloadResult:
    """An object of one part (a delta's files, manifests, configs): one read, one write.

    There is nothing to resume inside a single part, so no resume record is kept; the
    file still appears at ``dest`` only whole, by a rename. Two threads hops instead of
    eight: at a thousand replicas in one process (the local runtime's shared mode) the
    per-file overhead is what a small delta costs.
    """
    start, end = plan.bounds(0)

    read = _whole_range(read_range, start, end, url=url, key=key)

    if progress is not None:
        progress(0, plan.size)
    data = await call_with_retry(read, retry, what=f"get_range {key}")
    await run_in_thread(_write_whole, paths, data, partial)
    if progress is not None:
        progress(plan.size, plan.size)
    log.debug("download finished", extra={"url": url, "key": key, "size": plan.size})
    return DownloadResult(
        key=key, path=paths.dest, size=plan.size, fetched_bytes=len(data), resumed_bytes=0, parts=1
    )
