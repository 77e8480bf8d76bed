"""The codec on torch tensors, on any device: CUDA when there is one.

The same format, computed where the weights are: the transforms (changed mask,
positions, gaps, zigzag differences, byte planes) run on the tensors' device and only
the planes — a few bytes per changed element for the sparse codec — cross to the host
to be zstd-compressed by the same code as the numpy backend. Planes are identical for
identical bits, so a snapshot encoded from CUDA tensors is byte-identical to one
encoded from files, and :func:`patch_state_dict` rebuilds bit-identically to the
directory decoder. torch is imported when this module is, never by the core. The
words and their planes on torch are :mod:`hotload.snapshot.codec.torch_words`.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch

from hotload.api.kinds import Identity
from hotload.errors import ChainBroken, ChecksumMismatch, DecodeFailed
from hotload.snapshot.codec import context, dense, sparse
from hotload.snapshot.codec.tensor_codec import ChunkJob, plan_decode
from hotload.snapshot.codec.torch_words import host_words, unzigzag_add, words_of
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.digest import tensor_hash, tensor_set_digest
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.manifest import CodecId, Manifest, TensorEntry
from hotload.snapshot.patching import checked_delta
from hotload.snapshot.pieces import (
    decode_fresh,
    pieces,
    plan_piece,
    read_payload,
    stored_words,
    uses_previous,
)
from hotload.snapshot.safetensors_file import (
    SafetensorsHeader,
    TensorInfo,
    build_header,
    parse_header,
)
from hotload.snapshot.torch_dtypes import TORCH_DTYPES, safetensors_dtype

_NUMPY_SIGNED: Final = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


@dataclass(frozen=True)
class _Undo:
    name: str
    start: int
    positions: torch.Tensor | None
    """Changed positions in the chunk at ``start``; None: the whole chunk."""
    values: torch.Tensor


def patch_state_dict(
    state_dict: MutableMapping[str, torch.Tensor],
    snapshot: Path,
    *,
    held_identity: Identity | None = None,
) -> Manifest:
    """Apply an incremental snapshot to ``state_dict`` in place, on its tensors' device.

    All or nothing: every rebuilt tensor's xxh3-128 is checked (on the host) and on any
    error every change is undone. Tensors the delta rewrites (``raw``) are replaced by
    new tensors on the same device as the others; removed ones are dropped.
    """
    manifest = checked_delta(snapshot, held_identity)
    device = next(iter(state_dict.values())).device if state_dict else torch.device("cpu")
    undo: list[_Undo] = []
    replaced: dict[str, torch.Tensor | None] = {}
    keep = {t.name for t in manifest.tensors}
    with ExitStack() as stack:
        deltas = DeltaFiles(snapshot, manifest, stack)
        try:
            for entry in manifest.tensors:
                _patch_one(state_dict, deltas, entry, device, undo, replaced)
                _check(state_dict, entry, manifest)
        except BaseException:
            for record in reversed(undo):
                target = words_of(state_dict[record.name])[record.start :]
                if record.positions is None:
                    target[: record.values.numel()] = record.values
                else:
                    target[record.positions] = record.values
            for name, before in replaced.items():
                if before is None:
                    state_dict.pop(name, None)
                else:
                    state_dict[name] = before
            raise
    for name in [n for n in state_dict if n not in keep]:
        del state_dict[name]
    return manifest


def _torch_dtype(entry: TensorEntry) -> torch.dtype:
    names = {v: k for k, v in TORCH_DTYPES.items()}
    name = names.get(entry.dtype)
    if name is None:
        raise DecodeFailed("no torch dtype for this tensor", tensor=entry.name, dtype=entry.dtype)
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def _check(
    state: MutableMapping[str, torch.Tensor], entry: TensorEntry, manifest: Manifest
) -> None:
    tensor = state.get(entry.name)
    if tensor is None:
        raise ChainBroken("a delta needs a tensor the held weights lack", tensor=entry.name)
    host = words_of(tensor).cpu().numpy()
    found = tensor_hash(memoryview(host.view(np.uint8).data))
    if found != entry.hash:
        raise ChecksumMismatch(
            "patched tensor hash differs from the manifest",
            snapshot=manifest.identity,
            tensor=entry.name,
            expected=entry.hash,
            found=found,
        )


def _to_device(words: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(words.view(_NUMPY_SIGNED[width]).copy()).to(device)


def _patch_one(
    state: MutableMapping[str, torch.Tensor],
    deltas: DeltaFiles,
    entry: TensorEntry,
    device: torch.device,
    undo: list[_Undo],
    replaced: dict[str, torch.Tensor | None],
) -> None:
    if entry.codec is CodecId.UNCHANGED:
        return
    if entry.parts is not None:
        _patch_parts(state, deltas, entry, device, undo, replaced)
        return
    if entry.data is None:
        raise DecodeFailed("codec has no payload", tensor=entry.name, codec=str(entry.codec))
    width = DTYPES[entry.dtype].width
    jobs = plan_decode(
        entry.codec,
        deltas.read(entry.data),
        entry.numel,
        width,
        tensor=entry.name,
        changed=entry.changed,
    )
    if entry.codec is CodecId.RAW:
        fresh = np.zeros(entry.numel, dtype=DTYPES[entry.dtype].word)
        for job in jobs:
            job.run(fresh[job.start : job.start + job.length])
        _replace(state, entry, fresh, device, replaced)
        return
    words = _held_words(state, entry)
    for job in jobs:
        _apply(entry.name, job, words, width, undo)


def _replace(
    state: MutableMapping[str, torch.Tensor],
    entry: TensorEntry,
    fresh: np.ndarray,
    device: torch.device,
    replaced: dict[str, torch.Tensor | None],
) -> None:
    """Put the new tensor (host words ``fresh``) in the state_dict, on ``device``."""
    width = DTYPES[entry.dtype].width
    tensor = _to_device(fresh, width, device).view(_torch_dtype(entry)).reshape(entry.shape)
    replaced.setdefault(entry.name, state.get(entry.name))
    state[entry.name] = tensor


def _held_words(state: MutableMapping[str, torch.Tensor], entry: TensorEntry) -> torch.Tensor:
    """The held tensor's flat words, checked to be the entry's size."""
    held = state.get(entry.name)
    if held is None:
        raise ChainBroken("a delta needs a tensor the held weights lack", tensor=entry.name)
    if held.element_size() != DTYPES[entry.dtype].width or held.numel() != entry.numel:
        raise DecodeFailed(
            "held tensor does not match the delta's dtype and shape",
            tensor=entry.name,
            expected=f"{entry.dtype}{entry.shape}",
            found=f"{held.dtype}{list(held.shape)}",
        )
    return words_of(held)


def _patch_parts(
    state: MutableMapping[str, torch.Tensor],
    deltas: DeltaFiles,
    entry: TensorEntry,
    device: torch.device,
    undo: list[_Undo],
    replaced: dict[str, torch.Tensor | None],
) -> None:
    """A tensor stored as parts (v4): a new tensor when no part needs the previous one
    (built on the host, then moved), else each part patched in its range."""
    width = DTYPES[entry.dtype].width
    if not uses_previous(entry):
        _replace(state, entry, decode_fresh(entry, deltas), device, replaced)
        return
    words = _held_words(state, entry)
    for piece in pieces(entry):
        payload = read_payload(deltas, piece)
        if payload is None:
            continue  # unchanged
        if piece.codec is CodecId.STORED:
            out = words[piece.start : piece.stop]
            undo.append(_Undo(entry.name, piece.start, None, out.clone()))
            out.copy_(_to_device(stored_words(entry, piece, payload), width, out.device))
            continue
        for job in plan_piece(entry, piece, payload):
            _apply(entry.name, job, words, width, undo, piece.start)


def _apply(
    name: str, job: ChunkJob, words: torch.Tensor, width: int, undo: list[_Undo], offset: int = 0
) -> None:
    """Apply one chunk at ``offset + job.start`` of the tensor's words, recording what it
    overwrites first."""
    start = offset + job.start
    out = words[start : start + job.length]
    chunk = job.chunk
    if isinstance(chunk, (sparse.SparseChunk, context.ContextChunk)):
        if not chunk.changes:
            return
        if isinstance(chunk, context.ContextChunk):
            positions_np, zig_np = context.decode_changes(
                chunk, host_words(out, width), tensor=name
            )
        else:
            positions_np, zig_np = sparse.decode_changes(chunk, tensor=name)
        positions = torch.from_numpy(positions_np).to(out.device)
        before = out[positions]
        undo.append(_Undo(name, start, positions, before.clone()))
        out[positions] = unzigzag_add(before, _zig_to_device(zig_np, width, out.device))
        return
    decoded = dense.decode_words(chunk, np.dtype(f"u{width}"), tensor=name)
    undo.append(_Undo(name, start, None, out.clone()))
    if job.codec is CodecId.DENSE_XOR:
        out ^= _to_device(decoded, width, out.device)
    elif job.codec is CodecId.DENSE_SUB:
        out.copy_(unzigzag_add(out, _zig_to_device(decoded, width, out.device)))
    else:
        out.copy_(_to_device(decoded, width, out.device))


def _zig_to_device(zig: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
    """Zigzag words as non-negative int64 (their bits, for width 8) on ``device``."""
    values = zig.view(np.int64) if width == 8 else zig.astype(np.int64)
    return torch.from_numpy(values.copy()).to(device)


def state_dict_words(state_dict: MutableMapping[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of ``state_dict`` as its flat integer words (views, same device)."""
    return {name: words_of(tensor) for name, tensor in state_dict.items()}


@dataclass(frozen=True)
class TorchShard:
    """One shard of a state_dict, as the encoder sees a file: header, words, bytes."""

    relpath: str
    header: SafetensorsHeader
    tensors: dict[str, torch.Tensor]

    def words(self, tensor: TensorInfo) -> torch.Tensor:
        return words_of(self.tensors[tensor.name])

    def raw(self, tensor: TensorInfo) -> memoryview:
        host = words_of(self.tensors[tensor.name]).cpu().numpy()
        return memoryview(host.view(np.uint8).data)


@dataclass(frozen=True)
class TorchSource:
    """A state_dict laid out in shards, without writing it anywhere."""

    shards: dict[str, TorchShard]
    by_name: dict[str, tuple[TorchShard, TensorInfo]]

    def digest(self) -> str:
        return tensor_set_digest(
            (name, tensor_hash(shard.raw(info))) for name, (shard, info) in self.by_name.items()
        )


def torch_source(layout: list[tuple[str, list[tuple[str, torch.Tensor]]]]) -> TorchSource:
    """The source of shards ``layout`` ((shard name, [(tensor name, tensor)]) in order)."""
    shards: dict[str, TorchShard] = {}
    by_name: dict[str, tuple[TorchShard, TensorInfo]] = {}
    for relpath, group in layout:
        header_bytes, ranges = build_header(
            [(name, safetensors_dtype(t), tuple(t.shape)) for name, t in group], {"format": "pt"}
        )
        size = 8 + len(header_bytes) + (ranges[-1][1] if ranges else 0)
        header = parse_header(header_bytes, size, source=relpath)
        shard = TorchShard(relpath, header, {name: t.detach().contiguous() for name, t in group})
        shards[relpath] = shard
        for info in header.tensors:
            by_name[info.name] = (shard, info)
    return TorchSource(shards, by_name)
