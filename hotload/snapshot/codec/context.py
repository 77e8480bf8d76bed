"""The ``context`` payload: changes coded per class of the previous value (hotload-delta/v2).

Which elements an RL step moves is predictable from the weights the decoder already
holds: a bf16 element moves when its fp32 master crosses a rounding boundary, one unit
in the last place (ULP) away, and the ULP is set by the exponent. So the elements are
split into classes by their previous exponent (:mod:`context_model`), and per class the
gaps between changes are Golomb-coded (optimal for the geometric gaps of independent
changes) and the changes' signs and magnitudes follow (a sign bit for ±1 ULP). With one
class and no key it is a plain order-0 coder of the changes.

Layout (docs/snapshot-format.md, "Context payload")::

    varint chunk_elements
    model (key_shift, key_bits, lo, classes, per class: golomb, value_k)
    per chunk: varint changes; if changes > 0: varint stream_length
    streams, chunk-major

A chunk without changes has no stream and is not scanned. Decoding a chunk reads the
previous words of the chunk once and touches only the changed ones, like ``sparse``.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec import context_kernels
from hotload.snapshot.codec.changes import TensorChanges, keys_of, magnitudes_of
from hotload.snapshot.codec.context_model import (
    EXPONENT_KEYS,
    ContextModel,
    choose_model,
    fit_changes,
    read_model,
    write_model,
)
from hotload.snapshot.codec.dense import chunk_bounds
from hotload.snapshot.codec.jobs import map_jobs
from hotload.snapshot.codec.varint import Reader, write_varint
from hotload.snapshot.limits import MAX_CHUNK_ELEMENTS


@dataclass(frozen=True)
class ContextChunk:
    start: int
    length: int
    changes: int
    model: ContextModel
    stream: memoryview


@dataclass(frozen=True)
class ContextInputs:
    """What the encoder needs from one tensor, whatever backend computed it (host arrays)."""

    previous: np.ndarray
    """The previous words (unsigned)."""
    positions: np.ndarray
    """Changed positions, increasing (int64)."""
    values: np.ndarray
    """Their zigzag differences (words)."""
    _counts: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, compare=False)

    def key_counts(self, key_shift: int, key_bits: int) -> np.ndarray:
        """How many previous elements have each key (one pass, kept for the next model)."""
        found = self._counts.get((key_shift, key_bits))
        if found is None:
            keys = keys_of(self.previous, key_shift, key_bits)
            found = np.bincount(keys, minlength=1 << key_bits)
            self._counts[(key_shift, key_bits)] = found
        return found


def key_of(dtype: str | None) -> tuple[int, int]:
    """(key_shift, key_bits) for a dtype: its exponent field; (0, 0) when it has none."""
    return EXPONENT_KEYS.get(dtype or "", (0, 0))


def _fit(
    per_key: np.ndarray | None,
    elements: int,
    changed_keys: np.ndarray | None,
    magnitudes: np.ndarray,
    *,
    key_shift: int,
    key_bits: int,
    classes: int,
) -> ContextModel:
    """The model for a tensor's changes (``changed_keys``: their previous keys, None
    without a key; ``magnitudes``: theirs)."""
    return choose_model(
        per_key,
        elements,
        np.zeros(len(magnitudes), dtype=np.intp) if changed_keys is None else changed_keys,
        magnitudes,
        key_shift=key_shift,
        key_bits=key_bits,
        classes=classes,
    )


def _head(
    chunk_elements: int, model: ContextModel, counts: list[int], lengths: list[int]
) -> bytearray:
    """The payload before its streams (``lengths``: each chunk's stream's, 0 without)."""
    head = bytearray()
    write_varint(chunk_elements, head)
    write_model(model, head)
    for changes, length in zip(counts, lengths, strict=True):
        write_varint(changes, head)
        if changes:
            write_varint(length, head)
    return head


def _assemble(
    chunk_elements: int, model: ContextModel, counts: list[int], streams: list[bytes]
) -> bytes:
    head = _head(chunk_elements, model, counts, [len(s) for s in streams])
    return bytes(head) + b"".join(streams)


def encode(
    inputs: ContextInputs,
    chunk_elements: int,
    *,
    dtype: str | None,
    classes: int,
    executor: Executor | None = None,
) -> bytes:
    """The payload of one tensor with a model of up to ``classes`` classes (the
    reference path: whole-tensor arrays, whatever backend made them)."""
    key_shift, key_bits = key_of(dtype) if classes > 1 else (0, 0)
    previous, positions, values = inputs.previous, inputs.positions, inputs.values
    model = _fit(
        inputs.key_counts(key_shift, key_bits) if key_bits else None,
        len(previous),
        keys_of(previous[positions], key_shift, key_bits) if key_bits else None,
        magnitudes_of(values),
        key_shift=key_shift,
        key_bits=key_bits,
        classes=classes,
    )
    bounds = chunk_bounds(len(previous), chunk_elements)
    splits = np.searchsorted(positions, [start for start, _ in bounds] + [len(previous)])

    def one(index: int) -> bytes:
        start, length = bounds[index]
        lo, hi = int(splits[index]), int(splits[index + 1])
        if lo == hi:
            return b""
        return context_kernels.encode_chunk(
            previous[start : start + length],
            model,
            (positions[lo:hi] - start).astype(np.uint32),
            values[lo:hi],
        )

    indices = range(len(bounds))
    streams = map_jobs(executor, one, indices)
    counts = [int(splits[i + 1] - splits[i]) for i in indices]
    return _assemble(chunk_elements, model, counts, streams)


def encode_changes(
    previous: np.ndarray,
    found: TensorChanges,
    chunk_elements: int,
    *,
    dtype: str | None,
    classes: int,
    executor: Executor | None = None,
    simd: bool = True,
    model: ContextModel | None = None,
) -> bytes:
    """The same payload as :func:`encode`, from the changes one scan found per chunk
    (every chunk's changes collected; the key counts of ``dtype``'s key when
    ``classes`` > 1). ``model``: the one :func:`order0_length` fitted (``classes`` 1)."""
    if model is None:
        model = _fit_found(previous, found, dtype=dtype, classes=classes)

    def one(index: int) -> bytes:
        chunk = found.chunks[index]
        if not chunk.count:
            return b""
        return context_kernels.encode_chunk(
            previous[chunk.start : chunk.start + chunk.length],
            model,
            chunk.positions,
            chunk.values,
            simd=simd,
        )

    indices = range(len(found.chunks))
    streams = map_jobs(executor, one, indices)
    return _assemble(chunk_elements, model, [c.count for c in found.chunks], streams)


def order0_length(
    previous: np.ndarray, found: TensorChanges, chunk_elements: int
) -> tuple[int, ContextModel] | None:
    """(the length of :func:`encode_changes`' payload with one class, its model) without
    writing its streams (``_context.stream_lengths`` counts their bits): the encoder
    writes the order-0 payload only when it is not longer than the context one. None
    where the streams must be written to know (the kernels not built, a change the
    kernel would refuse)."""
    model = _fit_found(previous, found, dtype=None, classes=1)
    changed = [c for c in found.chunks if c.count]
    lengths = context_kernels.stream_lengths(
        [c.positions for c in changed],
        [c.values for c in changed],
        [c.length for c in changed],
        model,
    )
    if lengths is None:
        return None
    each = iter(lengths)
    counts = [c.count for c in found.chunks]
    head = _head(chunk_elements, model, counts, [next(each) if n else 0 for n in counts])
    return len(head) + sum(lengths), model


def _fit_found(
    previous: np.ndarray, found: TensorChanges, *, dtype: str | None, classes: int
) -> ContextModel:
    """The model of ``classes`` classes for the changes a scan found (natively where
    built, else :func:`choose_model` on arrays made of them)."""
    key_shift, key_bits = key_of(dtype) if classes > 1 else (0, 0)
    per_key = found.key_counts() if key_bits else None
    changed = [c for c in found.chunks if c.count]
    return fit_changes(
        [c.values for c in changed],
        [c.keys for c in changed],
        per_key,
        len(previous),
        key_shift=key_shift,
        key_bits=key_bits,
        classes=classes,
    ) or _fit(
        per_key,
        len(previous),
        found.previous_keys(previous, key_shift, key_bits) if key_bits else None,
        found.magnitudes(previous.dtype),
        key_shift=key_shift,
        key_bits=key_bits,
        classes=classes,
    )


def parse(payload: memoryview, numel: int, width: int, *, tensor: str) -> list[ContextChunk]:
    """Locate every chunk's stream, checking the layout against ``numel`` elements."""
    reader = Reader(payload)
    chunk_elements = reader.varint(limit=MAX_CHUNK_ELEMENTS, field="chunk_elements")
    if chunk_elements == 0:
        raise DecodeFailed("chunk_elements is zero", tensor=tensor)
    model = read_model(reader, width, tensor=tensor)
    heads: list[tuple[int, int, int, int]] = []
    for start, length in chunk_bounds(numel, chunk_elements):
        changes = reader.varint(limit=length, field="changes")
        stream_length = reader.varint(limit=len(payload), field="stream_length") if changes else 0
        heads.append((start, length, changes, stream_length))
    chunks = [
        ContextChunk(start, length, changes, model, reader.take(size, field="stream"))
        for start, length, changes, size in heads
    ]
    if reader.remaining():
        raise DecodeFailed("payload longer than its streams", tensor=tensor)
    return chunks


def decode_changes(
    chunk: ContextChunk, previous: np.ndarray, *, tensor: str
) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the chunk, zigzag differences) of one chunk, from its previous words."""
    if not chunk.changes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=previous.dtype)
    positions, values = context_kernels.decode_chunk(
        previous, chunk.model, chunk.stream, chunk.changes, what=f"{tensor}@{chunk.start}"
    )
    return positions.astype(np.int64), values
