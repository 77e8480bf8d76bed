"""Write a directory under a temporary name, fsync it, and rename it into place.

A reader never sees half a snapshot or half a rebuild: either ``out`` does not exist
(or is the empty directory it was) or it is complete. On any error the temporary
directory is removed, so a failure leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hotload.errors import ConfigError


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (inside a staging directory) and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def copy_file(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` (kernel copy where possible) and fsync it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    fsync_path(target)


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``out``; on success it becomes ``out`` atomically."""
    out = out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("output directory exists and is not empty", out=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield temporary
        for directory, _, _ in os.walk(temporary):
            fsync_path(Path(directory))
        if out.exists():
            out.rmdir()
        os.rename(temporary, out)
        fsync_path(out.parent)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
