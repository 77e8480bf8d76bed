"""Rebuild a delta by patching the previous directory's files where they lie.

Writing a fresh copy of every shard costs a page of new memory per 4 KiB of weights;
at RL learning rates fewer than 1% of the elements change, so patching the previous
snapshot's files in place costs only the changed pages plus one read to verify. This
*consumes* the previous directory: it is renamed to a temporary sibling of ``out``,
patched, verified tensor by tensor, and renamed to ``out``. On any error every change
is undone and the directory is renamed back, so the caller keeps exactly its previous
snapshot — no file written for the new one stays in it, a half-written one of a full
volume included (a crash mid-way, though, leaves neither: the caller refetches).

Possible when every shard keeps its path and its tensors (names, dtypes, shapes, places
in the data section): the common case, same architecture and sharding, even when a
trainer writes metadata such as the step into each header. A header that changed but
kept its length is overwritten in place; one whose length changed moves the data
section, so that shard is rewritten beside the old one (one copy of its data, the old
file kept aside until the rebuild succeeds). :func:`can_patch_in_place` says whether
the layout allows it; the decoder falls back to a fresh rebuild otherwise.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from hotload.errors import ConfigError, DecodeFailed
from hotload.snapshot.codec.frames import decompress_exact
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.layout import CONFIG, REBUILT_NAME, check_config_change, scan
from hotload.snapshot.manifest import Manifest, ShardEntry
from hotload.snapshot.mapping import mapped
from hotload.snapshot.patching import _check_patched, _patch_one, _revert, _Undo
from hotload.snapshot.paths import inside
from hotload.snapshot.safetensors_file import (
    SafetensorsHeader,
    length_prefix,
    parse_header,
    read_header,
)
from hotload.snapshot.shard_checks import check_shard_header
from hotload.snapshot.staging import copy_file, fsync_path

log = logging.getLogger(__name__)


def can_patch_in_place(previous: Path, snapshot: Path, manifest: Manifest) -> bool:
    """Every shard has a previous file of its path holding the same tensors at the same
    places of its data section (headers may differ in metadata and length)."""
    if not manifest.shards:
        return False
    with ExitStack() as stack:
        deltas = DeltaFiles(snapshot, manifest, stack)
        for shard in manifest.shards:
            path = previous / shard.path
            if not path.is_file():
                return False
            if shard.header is None:
                if path.stat().st_size != shard.size:
                    return False
                continue
            try:
                before = read_header(path)
            except DecodeFailed:
                return False
            header = stored_header(deltas, shard, manifest)
            after = parse_header(header, shard.size, source=shard.path)
            if _layout(before) != _layout(after):
                return False
    return True


def stored_header(deltas: DeltaFiles, shard: ShardEntry, manifest: Manifest) -> bytes:
    """The shard header stored in the delta, decompressed within its bound and checked
    against the manifest's length and hash."""
    if shard.header is None:
        raise DecodeFailed("the shard has no stored header", file=shard.path)
    frame = deltas.read(shard.header)
    header = decompress_exact(frame, shard.header_length, what=f"header of {shard.path}")
    if header is None:
        raise DecodeFailed("a stored shard header is empty", file=shard.path)
    check_shard_header(shard, header, manifest)
    return header


def _layout(header: SafetensorsHeader) -> set[tuple[str, str, tuple[int, ...], int, int]]:
    """What a patch relies on: each tensor's dtype, shape and place in the data section."""
    start = header.data_start
    return {(t.name, t.dtype.name, t.shape, t.begin - start, t.end - start) for t in header.tensors}


def rebuild_in_place(
    previous: Path,
    snapshot: Path,
    out: Path,
    manifest: Manifest,
    record: bytes,
    check: Callable[[], None] = lambda: None,
) -> None:
    """Turn the rebuilt directory ``previous`` into ``out`` holding ``manifest``'s snapshot.

    The caller has verified the stored files, the previous snapshot's identity and
    digest, and the referenced files. ``record`` is the new ``hotload-rebuilt.json``.
    ``check`` is called before each tensor; whatever it raises undoes every change.
    """
    out = out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("output directory exists and is not empty", out=str(out))
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    work.rmdir()
    os.rename(previous, work)
    backups: list[tuple[Path, Path | None]] = []  # (path, its old content's backup or None)
    try:
        _replace_files(work, snapshot, manifest, backups)
        _replace(work / REBUILT_NAME, record, backups)
        _stash_leftovers(work, manifest, backups)
        _patch_shards(work, snapshot, manifest, backups, check)
        if out.exists():
            out.rmdir()
        os.rename(work, out)
        fsync_path(out.parent)
    except BaseException:
        for path, backup in reversed(backups):
            if backup is None:
                path.unlink(missing_ok=True)
            else:
                os.replace(backup, path)
        os.rename(work, previous)
        raise
    for _, backup in backups:
        if backup is not None:
            (out / backup.relative_to(work)).unlink(missing_ok=True)


def _patch_shards(
    work: Path,
    snapshot: Path,
    manifest: Manifest,
    backups: list[tuple[Path, Path | None]],
    check: Callable[[], None],
) -> None:
    """Patch every tensor in its mapped file; on any error undo every change made."""
    undo: list[_Undo] = []
    headers: list[tuple[mmap.mmap, bytes]] = []  # (mapping, the header bytes it had)
    words: dict[str, np.ndarray] = {}
    with ExitStack() as stack:
        deltas = DeltaFiles(snapshot, manifest, stack)
        mappings = []
        for shard in manifest.shards:
            path = inside(work, shard.path)
            new_header = None
            if shard.header is not None:
                new_header = stored_header(deltas, shard, manifest)
                if len(new_header) != read_header(path).data_start - 8:
                    _rewrite_with_header(path, new_header, backups)
                    new_header = None
            header = read_header(path)
            handle = stack.enter_context(path.open("r+b"))
            mapping = stack.enter_context(mapped(handle.fileno(), shard.size, writable=True))
            mappings.append((mapping, handle))
            if new_header is not None:
                headers.append((mapping, bytes(mapping[8 : 8 + len(new_header)])))
                mapping[8 : 8 + len(new_header)] = new_header
            for info in header.tensors:
                words[info.name] = (
                    np.frombuffer(mapping, info.dtype.word, info.numel, info.begin)
                    if info.numel
                    else np.zeros(0, info.dtype.word)
                )
        try:
            for entry in manifest.tensors:
                check()
                _patch_one(words, deltas, entry, undo, raw_in_place=True)
                _check_patched(words, entry, manifest)
        except BaseException:
            for item in reversed(undo):
                _revert(words, item)
            for mapping, old in headers:
                mapping[8 : 8 + len(old)] = old
            raise
        finally:
            undo.clear()
            headers.clear()
            words.clear()
            for mapping, handle in mappings:
                mapping.flush()
                os.fsync(handle.fileno())


def _rewrite_with_header(
    path: Path, header: bytes, backups: list[tuple[Path, Path | None]]
) -> None:
    """Rewrite the shard at ``path`` with another header length: the new prefix and
    header, then the old data section copied behind them (the old file kept aside)."""
    fresh = path.with_name(f".{path.name}.new")
    old_start = read_header(path).data_start
    with _unfinished(fresh), path.open("rb") as source, fresh.open("wb") as target:
        target.write(length_prefix(header) + header)
        target.flush()
        size = os.fstat(source.fileno()).st_size - old_start
        copied = 0
        while copied < size:
            step = os.copy_file_range(
                source.fileno(), target.fileno(), size - copied, old_start + copied
            )
            if step <= 0:
                raise DecodeFailed("the previous shard ended while it was copied", file=path.name)
            copied += step
        target.flush()
        os.fsync(target.fileno())
    backup = path.with_name(f".{path.name}.old")
    os.replace(path, backup)
    backups.append((path, backup))
    os.replace(fresh, path)


@contextmanager
def _unfinished(fresh: Path) -> Iterator[None]:
    """A new file being written beside the one it replaces: removed if the writing fails
    (a full volume), so the directory restored after the failure holds no stray."""
    try:
        yield
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise


def _replace(path: Path, data: bytes | Path, backups: list[tuple[Path, Path | None]]) -> None:
    """Put ``data`` (bytes, or a file to copy) at ``path``, keeping the old file aside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f".{path.name}.new")
    with _unfinished(fresh):
        if isinstance(data, Path):
            copy_file(data, fresh)
        else:
            fresh.write_bytes(data)
            fsync_path(fresh)
    backup = None
    if path.exists():
        backup = path.with_name(f".{path.name}.old")
        os.replace(path, backup)
    backups.append((path, backup))
    os.replace(fresh, path)


def _replace_files(
    work: Path, snapshot: Path, manifest: Manifest, backups: list[tuple[Path, Path | None]]
) -> None:
    for entry in manifest.files:
        target = inside(work, entry.path)
        if entry.path == CONFIG and target.is_file():
            new = inside(snapshot, entry.path)
            check_config_change(target, new, manifest.ignored_config_fields)
        _replace(target, inside(snapshot, entry.path), backups)


def _stash_leftovers(
    work: Path, manifest: Manifest, backups: list[tuple[Path, Path | None]]
) -> None:
    """Set aside files of the previous snapshot that the new one does not have."""
    keep = {e.path for e in manifest.files} | {e.path for e in manifest.referenced}
    keep |= {s.path for s in manifest.shards}
    model = scan(work)
    for relpath in (*model.shards, *model.others):
        if relpath not in keep:
            path = inside(work, relpath)
            backup = path.with_name(f".{path.name}.old")
            os.replace(path, backup)
            backups.append((path, backup))
            log.info("file dropped by the new snapshot", extra={"file": relpath})


def record_bytes(manifest: Manifest, digest: str) -> bytes:
    return json.dumps(
        {
            "identity": manifest.identity,
            "step": manifest.step,
            "kind": manifest.kind.value,
            "tensorDigest": digest,
        },
        separators=(",", ":"),
    ).encode()
