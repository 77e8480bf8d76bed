"""Sparse payloads: which elements changed (gaps) and by how much (zigzag differences).

Layout per chunk (docs/snapshot-format.md, "Sparse payload")::

    varint chunk_elements
    per chunk: varint changes; if changes > 0: byte gap_planes (1..3),
               then gap_planes + width varint frame lengths
    frames, chunk-major: gap planes then value planes, least significant first

A gap is the number of unchanged elements before a change (since the previous change
in the chunk), so positions are ``cumsum(gap + 1) - 1``; they are strictly increasing
by construction and the decoder checks the last one lies inside the chunk. Decoding
touches only the changed elements: the rest of the output is the previous tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec import planes
from hotload.snapshot.codec.dense import chunk_bounds
from hotload.snapshot.codec.frames import compress_bytes, compress_plane, decompress_exact
from hotload.snapshot.codec.transforms import zigzag_diff
from hotload.snapshot.codec.varint import Reader, write_varint
from hotload.snapshot.limits import MAX_CHUNK_ELEMENTS

try:
    from hotload.snapshot.codec import _context
except ImportError:  # pragma: no cover - depends on how the checkout was installed
    _context = None  # type: ignore[assignment]

_GAP_WORD = np.dtype(np.uint32)


@dataclass(frozen=True)
class SparseChunk:
    start: int
    length: int
    changes: int
    gap_planes: int
    frames: tuple[memoryview, ...]


def gap_planes_for(max_gap: int) -> int:
    return 1 if max_gap < 1 << 8 else 2 if max_gap < 1 << 16 else 3


def chunk_planes(new: np.ndarray, old: np.ndarray) -> tuple[int, int, list[np.ndarray]]:
    """(changes, gap planes, planes: gaps then values) of one chunk (numpy backend)."""
    positions = np.flatnonzero(new != old)
    return planes_of_changes(positions, zigzag_diff(new[positions], old[positions]))


def planes_of_changes(
    positions: np.ndarray, values: np.ndarray
) -> tuple[int, int, list[np.ndarray]]:
    """(changes, gap planes, planes) of a chunk's changes: ``positions`` in the chunk,
    increasing, and their zigzag differences."""
    changes = len(positions)
    if changes == 0:
        return 0, 0, []
    gaps = np.diff(positions.astype(np.int64), prepend=-1) - 1
    gap_count = gap_planes_for(int(gaps.max()))
    return (
        changes,
        gap_count,
        planes.split(gaps.astype(_GAP_WORD), gap_count) + planes.split(values),
    )


def compress_chunk(
    made: tuple[int, int, list[np.ndarray]], level: int
) -> tuple[int, int, list[bytes]]:
    changes, gap_count, chunk_planes = made
    return changes, gap_count, [compress_plane(p, level) for p in chunk_planes]


def compress_changes(
    positions: np.ndarray, values: np.ndarray, level: int, *, native: bool = True
) -> tuple[int, int, list[bytes]]:
    """(changes, gap planes, frames) of a chunk's changes (``positions``: uint32, in the
    chunk, increasing). Natively, the planes come from one pass
    (``_context.sparse_planes``); the same frames as :func:`planes_of_changes`'."""
    changes = len(positions)
    if not native or not changes or not hasattr(_context, "sparse_planes"):
        return compress_chunk(planes_of_changes(positions, values), level)
    gap_count, made = _context.sparse_planes(
        np.ascontiguousarray(positions, dtype=np.uint32).data,
        np.ascontiguousarray(values).data,
        values.dtype.itemsize,
    )
    return changes, gap_count, [b"" if p is None else compress_bytes(p, level) for p in made]


def encode_chunk(new: np.ndarray, old: np.ndarray, level: int) -> tuple[int, int, list[bytes]]:
    """(changes, gap planes, frames) of one chunk."""
    return compress_chunk(chunk_planes(new, old), level)


def assemble(chunk_elements: int, chunks: list[tuple[int, int, list[bytes]]]) -> bytes:
    head = bytearray()
    write_varint(chunk_elements, head)
    for changes, gap_count, frames in chunks:
        write_varint(changes, head)
        if changes:
            head.append(gap_count)
            for frame in frames:
                write_varint(len(frame), head)
    return bytes(head) + b"".join(f for _, _, frames in chunks for f in frames)


def parse(payload: memoryview, numel: int, width: int, *, tensor: str) -> list[SparseChunk]:
    reader = Reader(payload)
    chunk_elements = reader.varint(limit=MAX_CHUNK_ELEMENTS, field="chunk_elements")
    if chunk_elements == 0:
        raise DecodeFailed("chunk_elements is zero", tensor=tensor)
    heads: list[tuple[int, int, int, int, list[int]]] = []
    for start, length in chunk_bounds(numel, chunk_elements):
        changes = reader.varint(limit=length, field="changes")
        gap_count = 0
        lengths: list[int] = []
        if changes:
            gap_count = reader.byte(field="gap_planes")
            if gap_count not in (1, 2, 3):
                raise DecodeFailed("gap_planes must be 1, 2 or 3", tensor=tensor, found=gap_count)
            lengths = [
                reader.varint(limit=len(payload), field="frame_length")
                for _ in range(gap_count + width)
            ]
        heads.append((start, length, changes, gap_count, lengths))
    chunks = [
        SparseChunk(
            start, length, changes, gap_count, tuple(reader.take(n, field="frame") for n in lengths)
        )
        for start, length, changes, gap_count, lengths in heads
    ]
    if reader.remaining():
        raise DecodeFailed("payload longer than its frames", tensor=tensor)
    return chunks


def decode_changes(chunk: SparseChunk, *, tensor: str) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the chunk, zigzag differences) of one chunk's changes."""
    what = f"{tensor}@{chunk.start}"
    data = [decompress_exact(frame, chunk.changes, what=what) for frame in chunk.frames]
    gaps = planes.join(data[: chunk.gap_planes], chunk.changes, _GAP_WORD)
    positions = np.cumsum(gaps, dtype=np.int64)
    positions += np.arange(chunk.changes, dtype=np.int64)
    if positions[-1] >= chunk.length:
        raise DecodeFailed("sparse position past the end of its chunk", what=what)
    width = len(chunk.frames) - chunk.gap_planes
    word = np.dtype(f"u{width}")
    return positions, planes.join(data[chunk.gap_planes :], chunk.changes, word)
