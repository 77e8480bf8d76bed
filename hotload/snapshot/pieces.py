"""A tensor's stored form as *pieces*: what every decoder walks, whether the tensor is
stored whole (one piece: the tensor's own codec and payload) or as parts (v4: one piece
per part, each a contiguous range of the flattened tensor with its own codec and payload).

Each reader (the fresh rebuild, the in-place patch of files, of numpy arrays, of torch
tensors, the verifier) decodes a piece exactly as it decoded a whole tensor before, into
the piece's range of the tensor's words; only ``stored`` pieces (a part's bytes as they
are) are new to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec.tensor_codec import ChunkJob, needs_previous, plan_decode
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.manifest import ByteRange, CodecId, TensorEntry

ReadRange = Callable[[ByteRange], memoryview]


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, start + length)`` of one tensor, and how they are stored."""

    start: int
    length: int
    codec: CodecId
    """Never ``parts``; ``stored`` only for a part (a whole stored tensor is in its shard)."""
    data: ByteRange | None
    changed: int | None

    @property
    def stop(self) -> int:
        return self.start + self.length


def pieces(entry: TensorEntry) -> list[Piece]:
    """The tensor's pieces in order: its parts, or itself whole."""
    if entry.parts is None:
        return [Piece(0, entry.numel, entry.codec, entry.data, entry.changed)]
    return [Piece(p.start, p.length, p.codec, p.data, p.changed) for p in entry.parts]


def uses_previous(entry: TensorEntry) -> bool:
    """Whether some element of the tensor starts as the previous tensor's."""
    return any(needs_previous(piece.codec) for piece in pieces(entry))


def plan_piece(entry: TensorEntry, piece: Piece, payload: memoryview) -> list[ChunkJob]:
    """The chunk jobs of a payload piece (starts relative to the piece); DecodeFailed if
    the payload's layout does not fit it."""
    return plan_decode(
        piece.codec,
        payload,
        piece.length,
        DTYPES[entry.dtype].width,
        tensor=entry.name,
        changed=piece.changed,
    )


def stored_words(entry: TensorEntry, piece: Piece, payload: memoryview) -> np.ndarray:
    """A ``stored`` piece's words, read straight from its bytes (checked to be its size)."""
    dtype = DTYPES[entry.dtype]
    if len(payload) != piece.length * dtype.width:
        raise DecodeFailed(
            "a stored part is not its size",
            tensor=entry.name,
            start=piece.start,
            expected=piece.length * dtype.width,
            found=len(payload),
        )
    return np.frombuffer(payload, dtype=dtype.word, count=piece.length)


def read_payload(deltas: DeltaFiles, piece: Piece) -> memoryview | None:
    return None if piece.data is None else deltas.read(piece.data)


def check_layouts(entry: TensorEntry, read: ReadRange) -> None:
    """Every piece's payload fits it (no frame opened): what ``verify`` checks."""
    for piece in pieces(entry):
        if piece.data is None:
            continue
        payload = read(piece.data)
        if piece.codec is CodecId.STORED:
            stored_words(entry, piece, payload)
        else:
            plan_piece(entry, piece, payload)


def decode_fresh(entry: TensorEntry, deltas: DeltaFiles) -> np.ndarray:
    """The whole tensor as a new flat word array, from parts none of which needs the
    previous tensor (``stored`` and ``raw``)."""
    fresh = np.empty(entry.numel, dtype=DTYPES[entry.dtype].word)
    for piece in pieces(entry):
        data = read_payload(deltas, piece) or memoryview(b"")
        target = fresh[piece.start : piece.stop]
        if piece.codec is CodecId.STORED:
            target[...] = stored_words(entry, piece, data)
            continue
        for job in plan_piece(entry, piece, data):
            job.run(target[job.start : job.start + job.length])
    return fresh
