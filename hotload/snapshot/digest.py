"""Hashes of the format: stored files (sha256, adler32 on input) and rebuilt tensors (xxh3-128).

sha256 guards what crossed the network (cheap: deltas are small); xxh3-128 guards what
the decoder produced, at memory speed. ``tensor_set_digest`` condenses a snapshot's
tensor hashes into one value, so a delta can name exactly which weights it applies to;
``referenced_digest`` does the same for the files a v3 delta references.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from hotload.errors import ChecksumMismatch
from hotload.snapshot.manifest import FileHash, StoredFile

if TYPE_CHECKING:
    from typing_extensions import Buffer

_READ_BLOCK = 4 * 1024 * 1024


def tensor_hash(data: Buffer) -> str:
    """xxh3-128 hex digest of a tensor's bytes."""
    return xxhash.xxh3_128_hexdigest(data)


def tensor_set_digest(hashes: Iterable[tuple[str, str]]) -> str:
    """xxh3-128 over ``name NUL hash LF`` of every (name, tensor hash), sorted by name."""
    state = xxhash.xxh3_128()
    for name, digest in sorted(hashes):
        state.update(name.encode("utf-8", "surrogatepass") + b"\0" + digest.encode() + b"\n")
    return state.hexdigest()


def referenced_digest(entries: Iterable[tuple[str, int, str]]) -> str:
    """sha256 over ``path NUL size NUL sha256 LF`` of every (path, size, sha256 hex), in the
    manifest's order: one commitment to every file a v3 delta takes from the previous
    directory, as strong as a sha256 each and 32 bytes instead of 32 per file."""
    state = hashlib.sha256()
    for path, size, digest in entries:
        state.update(f"{path}\0{size}\0{digest}\n".encode("utf-8", "surrogatepass"))
    return state.hexdigest()


def file_digest(path: Path, family: FileHash = FileHash.SHA256) -> str:
    """Hex digest of the file at ``path`` in ``family``."""
    with path.open("rb") as handle:
        if family is FileHash.SHA256:
            return hashlib.file_digest(handle, "sha256").hexdigest()
        value = 1
        while block := handle.read(_READ_BLOCK):
            value = zlib.adler32(block, value)
        return f"{value:08x}"


def bytes_digest(data: Buffer, family: FileHash = FileHash.SHA256) -> str:
    if family is FileHash.SHA256:
        return hashlib.sha256(data).hexdigest()
    return f"{zlib.adler32(data):08x}"


def check_file(path: Path, entry: StoredFile, family: FileHash, *, snapshot: str) -> None:
    """Raise :class:`ChecksumMismatch` unless the file has the size and hash ``entry`` says.

    The size is checked first (a truncated download fails without hashing it).
    """
    size = path.stat().st_size
    if size != entry.size:
        raise ChecksumMismatch(
            "file size differs from the manifest",
            snapshot=snapshot,
            file=entry.path,
            expected=entry.size,
            found=size,
        )
    found = file_digest(path, family)
    if found != entry.hash:
        raise ChecksumMismatch(
            "file hash differs from the manifest",
            snapshot=snapshot,
            file=entry.path,
            expected=entry.hash,
            found=found,
        )
