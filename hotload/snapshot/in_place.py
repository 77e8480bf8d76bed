"""Rebuild a delta by patching the previous directory's files where they lie.

Writing a fresh copy of every shard costs a page of new memory per 4 KiB of weights;
at RL learning rates fewer than 1% of the elements change, so patching the previous
snapshot's files in place costs only the changed pages plus one read to verify. This
*consumes* the previous directory: it is renamed to a temporary sibling of ``out``,
patched, verified tensor by tensor, and renamed to ``out``. On any error every change
is undone and the directory is renamed back, so the caller keeps exactly its previous
snapshot (a crash mid-way, though, leaves neither: the caller refetches).

Only possible when every shard keeps its path and header (the common case: same
architecture, same sharding); :func:`can_patch_in_place` says so, and the decoder
falls back to a fresh rebuild otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from hotload.errors import ConfigError
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.layout import CONFIG, REBUILT_NAME, check_config_change, scan
from hotload.snapshot.manifest import Manifest
from hotload.snapshot.mapping import mapped
from hotload.snapshot.patching import _check_patched, _patch_one, _revert, _Undo
from hotload.snapshot.paths import inside
from hotload.snapshot.safetensors_file import read_header
from hotload.snapshot.staging import copy_file, fsync_path

log = logging.getLogger(__name__)


def can_patch_in_place(previous: Path, manifest: Manifest) -> bool:
    """Every shard reuses the previous file of its path, with the same header."""
    if not manifest.shards or any(shard.header is not None for shard in manifest.shards):
        return False
    for shard in manifest.shards:
        path = previous / shard.path
        if not path.is_file() or path.stat().st_size != shard.size:
            return False
    return True


def rebuild_in_place(
    previous: Path, snapshot: Path, out: Path, manifest: Manifest, record: bytes
) -> None:
    """Turn the rebuilt directory ``previous`` into ``out`` holding ``manifest``'s snapshot.

    The caller has verified the stored files, the previous snapshot's identity and
    digest, and the referenced files. ``record`` is the new ``hotload-rebuilt.json``.
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
        _patch_shards(work, snapshot, manifest)
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


def _patch_shards(work: Path, snapshot: Path, manifest: Manifest) -> None:
    """Patch every tensor in its mapped file; on any error undo every change made."""
    undo: list[_Undo] = []
    words: dict[str, np.ndarray] = {}
    with ExitStack() as stack:
        deltas = DeltaFiles(snapshot, manifest, stack)
        mappings = []
        for shard in manifest.shards:
            path = inside(work, shard.path)
            header = read_header(path)
            handle = stack.enter_context(path.open("r+b"))
            mapping = stack.enter_context(mapped(handle.fileno(), shard.size, writable=True))
            mappings.append((mapping, handle))
            for info in header.tensors:
                words[info.name] = (
                    np.frombuffer(mapping, info.dtype.word, info.numel, info.begin)
                    if info.numel
                    else np.zeros(0, info.dtype.word)
                )
        try:
            for entry in manifest.tensors:
                _patch_one(words, deltas, entry, undo, raw_in_place=True)
                _check_patched(words, entry, manifest)
        except BaseException:
            for item in reversed(undo):
                _revert(words, item)
            raise
        finally:
            undo.clear()
            words.clear()
            for mapping, handle in mappings:
                mapping.flush()
                os.fsync(handle.fileno())


def _replace(path: Path, data: bytes | Path, backups: list[tuple[Path, Path | None]]) -> None:
    """Put ``data`` (bytes, or a file to copy) at ``path``, keeping the old file aside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f".{path.name}.new")
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
    keep = {e.path for e in (*manifest.files, *manifest.referenced)}
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
