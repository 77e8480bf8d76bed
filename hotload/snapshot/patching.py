"""Apply an incremental snapshot to weights held in memory, in place, all or nothing.

An engine (or a benchmark) that holds the previous weights as arrays need not rebuild
a directory: :func:`patch_tensors` decodes each tensor's payload straight into its
array, touching only the changed elements for the sparse codec, then checks every
tensor's xxh3-128. If anything fails — a corrupt payload, a wrong previous tensor, a
hash — every change already made is undone before the error propagates, so the caller
keeps exactly the weights it had.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from concurrent.futures import Executor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotload.api import SnapshotKind
from hotload.api.kinds import Identity
from hotload.errors import ChainBroken, ChecksumMismatch, DecodeFailed
from hotload.snapshot.codec.tensor_codec import ChunkJob, plan_decode
from hotload.snapshot.codec.transforms import apply_changes
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.digest import tensor_hash
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.manifest import CodecId, Manifest, TensorEntry, read_manifest
from hotload.snapshot.pieces import (
    decode_fresh,
    pieces,
    plan_piece,
    read_payload,
    stored_words,
    uses_previous,
)
from hotload.snapshot.verifier import verify_stored_files


@dataclass(frozen=True)
class _Undo:
    name: str
    words: np.ndarray
    positions: np.ndarray | None
    values: np.ndarray | None
    replaced: np.ndarray | None
    """For a raw tensor: the array that was in the mapping before (or None if new)."""
    start: int = 0
    """Where ``words`` (a chunk) starts in its tensor."""


def words_of(array: np.ndarray, entry: TensorEntry) -> np.ndarray:
    """A flat view of ``array``'s bits as the entry's words; DecodeFailed if it cannot be."""
    dtype = DTYPES[entry.dtype]
    if not array.flags.c_contiguous or array.nbytes != entry.nbytes:
        raise DecodeFailed(
            "held tensor does not match the delta's dtype and shape",
            tensor=entry.name,
            expected=entry.nbytes,
            found=array.nbytes,
        )
    return array.reshape(-1).view(np.uint8).view(dtype.word)


def checked_delta(
    snapshot: Path, held_identity: Identity | None, manifest: Manifest | None = None
) -> Manifest:
    """The delta's manifest once it may patch what is held: a delta, of the held
    snapshot, whose stored files all check out (before any weight is touched)."""
    manifest = manifest or read_manifest(snapshot)
    if manifest.kind is not SnapshotKind.INCREMENTAL:
        raise DecodeFailed(
            "only an incremental snapshot patches weights in place", kind=manifest.kind.value
        )
    if held_identity is not None and held_identity != manifest.previous:
        raise ChainBroken(
            "the held weights are not this delta's previous snapshot",
            identity=manifest.identity,
            expected=manifest.previous,
            found=held_identity,
        )
    verify_stored_files(snapshot, manifest)
    return manifest


ChangeSink = Callable[[str, int, "np.ndarray | None", int], None]
"""``(tensor, chunk start, positions in the chunk or None for all of it, chunk length)``:
told of every range a patch wrote, so a caller that mirrors the weights elsewhere (an
engine computing in another dtype) can copy exactly those elements once it succeeded."""


def patch_tensors(
    tensors: MutableMapping[str, np.ndarray],
    snapshot: Path,
    *,
    held_identity: Identity | None = None,
    manifest: Manifest | None = None,
    on_change: ChangeSink | None = None,
    raw_in_place: bool = False,
    executor: Executor | None = None,
) -> Manifest:
    """Patch ``tensors`` (name → C-contiguous array of the previous weights) in place.

    New tensors (codec ``raw``) are inserted as flat word arrays (with ``raw_in_place``,
    written into the held array, which must have the tensor's size); tensors the
    snapshot no longer has are removed. ``held_identity``, when given, must be the
    delta's previous snapshot (:class:`ChainBroken` otherwise). ``on_change`` hears of
    every range written; when the call raises, every change has been undone. With an
    ``executor``, the chunks of each tensor are decoded on it in parallel (they write
    disjoint ranges; one tensor at a time, so its checks and reports stay in order).
    """
    manifest = checked_delta(snapshot, held_identity, manifest)
    undo: list[_Undo] = []
    removed = {name: tensors[name] for name in set(tensors) - {t.name for t in manifest.tensors}}
    with ExitStack() as stack:
        deltas = DeltaFiles(snapshot, manifest, stack)
        try:
            for entry in manifest.tensors:
                _patch_one(
                    tensors, deltas, entry, undo, raw_in_place=raw_in_place, executor=executor
                )
                _check_patched(tensors, entry, manifest)
                if on_change is not None:
                    _report(entry, undo, on_change)
        except BaseException:
            for record in reversed(undo):
                _revert(tensors, record)
            raise
    for name in removed:
        del tensors[name]
    return manifest


def _report(entry: TensorEntry, undo: list[_Undo], on_change: ChangeSink) -> None:
    """Tell ``on_change`` what the patch of ``entry`` wrote (its undo records say it)."""
    if entry.codec is CodecId.UNCHANGED:
        return
    for record in reversed(undo):
        if record.name != entry.name:
            break
        if record.values is None:  # a new array replaced the held one
            on_change(entry.name, 0, None, entry.numel)
            continue
        on_change(entry.name, record.start, record.positions, len(record.words))


def _check_patched(
    tensors: MutableMapping[str, np.ndarray], entry: TensorEntry, manifest: Manifest
) -> None:
    if entry.name not in tensors:
        raise ChainBroken("a delta needs a tensor the held weights lack", tensor=entry.name)
    found = tensor_hash(memoryview(words_of(tensors[entry.name], entry).data))
    if found != entry.hash:
        raise ChecksumMismatch(
            "patched tensor hash differs from the manifest",
            snapshot=manifest.identity,
            tensor=entry.name,
            expected=entry.hash,
            found=found,
        )


def _patch_one(
    tensors: MutableMapping[str, np.ndarray],
    deltas: DeltaFiles,
    entry: TensorEntry,
    undo: list[_Undo],
    *,
    raw_in_place: bool = False,
    executor: Executor | None = None,
) -> None:
    """Patch one tensor, appending to ``undo`` before each change (so a failure midway
    can still be undone)."""
    if entry.codec is CodecId.UNCHANGED:
        return
    if entry.parts is not None:
        _patch_parts(tensors, deltas, entry, undo, raw_in_place=raw_in_place, executor=executor)
        return
    if entry.data is None:
        raise DecodeFailed("codec has no payload", tensor=entry.name, codec=str(entry.codec))
    payload = deltas.read(entry.data)
    dtype = DTYPES[entry.dtype]
    jobs = plan_decode(
        entry.codec,
        payload,
        entry.numel,
        dtype.width,
        tensor=entry.name,
        changed=entry.changed,
    )
    if entry.codec is CodecId.RAW and not raw_in_place:
        fresh = np.empty(entry.numel, dtype=dtype.word)
        for job in jobs:
            job.run(fresh[job.start : job.start + job.length])
        _replace(tensors, entry.name, fresh, undo)
        return
    _run_jobs(entry.name, jobs, _held(tensors, entry), undo, executor)


def _replace(
    tensors: MutableMapping[str, np.ndarray], name: str, fresh: np.ndarray, undo: list[_Undo]
) -> None:
    """Put a new array in the mapping (the one it replaces kept for the undo)."""
    undo.append(_Undo(name, fresh, None, None, tensors.get(name)))
    tensors[name] = fresh


def _held(tensors: MutableMapping[str, np.ndarray], entry: TensorEntry) -> np.ndarray:
    if entry.name not in tensors:
        raise ChainBroken("a delta needs a tensor the held weights lack", tensor=entry.name)
    return words_of(tensors[entry.name], entry)


def _patch_parts(
    tensors: MutableMapping[str, np.ndarray],
    deltas: DeltaFiles,
    entry: TensorEntry,
    undo: list[_Undo],
    *,
    raw_in_place: bool,
    executor: Executor | None,
) -> None:
    """Patch a tensor stored as parts (v4), part by part, each into its range. A tensor
    none of whose parts needs the previous one (all ``stored`` or ``raw``) is built as a
    new array, as a whole ``raw`` tensor is."""
    if not uses_previous(entry) and not (raw_in_place and entry.name in tensors):
        _replace(tensors, entry.name, decode_fresh(entry, deltas), undo)
        return
    words = _held(tensors, entry)
    for piece in pieces(entry):
        payload = read_payload(deltas, piece)
        if payload is None:
            continue  # unchanged
        target = words[piece.start : piece.stop]
        if piece.codec is CodecId.STORED:
            source = stored_words(entry, piece, payload)
            undo.append(_Undo(entry.name, target, None, target.copy(), None, piece.start))
            target[...] = source
            continue
        jobs = plan_piece(entry, piece, payload)
        _run_jobs(entry.name, jobs, target, undo, executor, offset=piece.start)


def _run_jobs(
    name: str,
    jobs: list[ChunkJob],
    words: np.ndarray,
    undo: list[_Undo],
    executor: Executor | None,
    offset: int = 0,
) -> None:
    """Apply ``jobs`` to ``words`` (elements ``offset…`` of the tensor), on ``executor``
    when there is one and more than one job."""
    if executor is None or len(jobs) < 2:
        for job in jobs:
            _apply(name, job, words, undo, offset)
        return
    # Every job is waited for, even after one fails, so that no thread is still writing
    # when the caller undoes (list.append is atomic: each job's records land whole).
    futures = [executor.submit(_apply, name, job, words, undo, offset) for job in jobs]
    wait(futures)
    for future in futures:
        future.result()


def _apply(name: str, job: ChunkJob, words: np.ndarray, undo: list[_Undo], offset: int = 0) -> None:
    """Apply one chunk, recording what it overwrites first (``offset``: where ``words``
    starts in its tensor, so the record names the tensor's own positions)."""
    out = words[job.start : job.start + job.length]
    found = job.changes(out)
    if found is not None:
        positions, values = found
        if not len(positions):
            return
        # One pass that checks every position before writing any, so the undo record
        # (the words that were there) is complete whenever a word has changed.
        try:
            before = apply_changes(out, positions, values)
        except ValueError as err:
            raise DecodeFailed(str(err), tensor=name) from None
        undo.append(_Undo(name, out, positions, before, None, offset + job.start))
        return
    undo.append(_Undo(name, out, None, out.copy(), None, offset + job.start))
    job.run(out)


def _revert(tensors: MutableMapping[str, np.ndarray], record: _Undo) -> None:
    if record.values is None:
        if record.replaced is None:
            tensors.pop(record.name, None)
        else:
            tensors[record.name] = record.replaced
    elif record.positions is None:
        record.words[...] = record.values
    else:
        record.words[record.positions] = record.values
