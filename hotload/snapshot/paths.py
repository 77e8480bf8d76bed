"""Relative paths inside a snapshot: validated once, so no name can leave its directory.

A manifest names files that the sidecar downloads and the decoder writes; every such
name passes :func:`safe_relpath` (at parse time, through the manifest's types) and every
filesystem access goes through :func:`inside`, which re-checks and resolves the result
against the root, so a symlink planted in a directory cannot redirect a write either.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from hotload.errors import UnsafePath
from hotload.snapshot.limits import MAX_PATH_BYTES

_FORBIDDEN_CHARS = frozenset("\\\0:") | frozenset(chr(c) for c in range(32)) | {"\x7f"}


def safe_relpath(path: str) -> str:
    """``path`` if it is a plain relative POSIX path of safe segments, else :class:`UnsafePath`.

    Allowed: ``config.json``, ``1_Pooling/config.json``. Refused: empty, absolute
    (``/etc/passwd``), ``..`` or ``.`` segments, empty segments (``a//b``, ``a/``),
    backslashes, colons (drive letters, alternate streams), control characters, and
    anything longer than :data:`~hotload.snapshot.limits.MAX_PATH_BYTES`.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePath("a file name is empty", path=path)
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise UnsafePath("a file name is too long", path=path[:80], limit=MAX_PATH_BYTES)
    if path.startswith("/"):
        raise UnsafePath("a file name is absolute", path=path)
    if any(char in _FORBIDDEN_CHARS for char in path):
        raise UnsafePath("a file name holds a forbidden character", path=path)
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise UnsafePath("a file name has an empty, '.' or '..' segment", path=path)
    return path


def inside(root: Path, relpath: str) -> Path:
    """``root / relpath``, refusing any result that resolves outside ``root``.

    ``relpath`` is a safe relative path (no ``..``), so only a symlink on its own
    components can lead outside: when none of them is a symlink (the common case: one
    ``lstat`` per component), ``root / relpath`` is the answer. Otherwise both are
    resolved in full and compared (two ``realpath`` walks of every component of the
    root, a few dozen system calls under a deep staging directory: that cost, paid per
    file by a thousand replicas in one process, was the largest of a tiny delta's load).
    """
    safe_relpath(relpath)
    if not _symlink_on(root, relpath):
        return root / relpath
    base = root.resolve()
    target = (base / PurePosixPath(relpath)).resolve()
    if target != base and base not in target.parents:
        raise UnsafePath("a file name resolves outside its directory", path=relpath)
    return target


def _symlink_on(root: Path, relpath: str) -> bool:
    """True when a component of ``relpath`` under ``root`` is a symlink (or cannot be
    told: the caller then takes the full check); False once one does not exist (nothing
    below it does)."""
    current = str(root)
    for segment in relpath.split("/"):
        current = f"{current}/{segment}"
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return False
        except OSError:
            return True
        if stat.S_ISLNK(mode):
            return True
    return False
