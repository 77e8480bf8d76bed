"""Relative paths inside a snapshot: validated once, so no name can leave its directory.

A manifest names files that the sidecar downloads and the decoder writes; every such
name passes :func:`safe_relpath` (at parse time, through the manifest's types) and every
filesystem access goes through :func:`inside`, which re-checks and resolves the result
against the root, so a symlink planted in a directory cannot redirect a write either.
"""

from __future__ import annotations

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
    """``root / relpath``, refusing any result that resolves outside ``root``."""
    safe_relpath(relpath)
    base = root.resolve()
    target = (base / PurePosixPath(relpath)).resolve()
    if target != base and base not in target.parents:
        raise UnsafePath("a file name resolves outside its directory", path=relpath)
    return target
