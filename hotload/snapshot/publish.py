"""Upload an encoded snapshot directory to a bucket: files in parallel, the manifest last.

The manifest is what makes a snapshot exist (CONTRACTS.md, "Names and identity"): a reader
that finds it can trust every file it lists to be complete, so it is written only once
every other file is in place. Used by the trainer side (``hotload.publish``, the demo).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hotload.api.kinds import Identity
from hotload.errors import ManifestInvalid
from hotload.snapshot.manifest import MANIFEST_NAME
from hotload.storage import Storage

#: Files uploaded at once (each may itself be a parallel multipart upload).
DEFAULT_UPLOAD_CONCURRENCY: Final = 8

UploadProgress = Callable[[int, int], None]
"""Called as ``progress(done_bytes, total_bytes)`` after each file."""


@dataclass(frozen=True)
class UploadReport:
    """What one upload of a snapshot directory wrote."""

    keys: tuple[str, ...]
    """Every key written, the manifest last."""
    bytes: int
    """Bytes of every file uploaded."""
    seconds: float


def snapshot_files(directory: Path) -> list[str]:
    """Relative paths of the snapshot's files, in upload order (the manifest last)."""
    files = sorted(
        str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()
    )
    if MANIFEST_NAME not in files:
        raise ManifestInvalid("no manifest in the snapshot directory", directory=str(directory))
    return [name for name in files if name != MANIFEST_NAME] + [MANIFEST_NAME]


async def upload_snapshot(
    storage: Storage,
    directory: Path,
    identity: Identity,
    *,
    concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
    progress: UploadProgress | None = None,
) -> UploadReport:
    """Put ``directory`` under ``<identity>/`` in ``storage``: every file but the manifest
    in parallel (``concurrency`` at a time), then the manifest once they all succeeded.

    A failure stops before the manifest: the bucket then holds no snapshot, only files a
    retry overwrites (and ``hotload gc`` removes).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    started = time.monotonic()
    relpaths = snapshot_files(directory)
    sizes = {relpath: (directory / relpath).stat().st_size for relpath in relpaths}
    total = sum(sizes.values())
    done = 0
    limit = asyncio.Semaphore(concurrency)

    async def put(relpath: str) -> None:
        nonlocal done
        async with limit:
            await storage.put_file(f"{identity}/{relpath}", directory / relpath)
        done += sizes[relpath]
        if progress is not None:
            progress(done, total)

    *files, manifest = relpaths
    tasks = [asyncio.ensure_future(put(relpath)) for relpath in files]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # One file failed: stop the others (no manifest will follow them anyway).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    await put(manifest)
    return UploadReport(
        keys=tuple(f"{identity}/{relpath}" for relpath in relpaths),
        bytes=total,
        seconds=time.monotonic() - started,
    )


async def publish_snapshot(storage: Storage, directory: Path, identity: Identity) -> list[str]:
    """Put ``directory`` under ``<identity>/`` in ``storage``; the keys written, in order."""
    report = await upload_snapshot(storage, directory, identity)
    return list(report.keys)
