"""Dense payloads (``raw``, ``dense-xor``, ``dense-sub``): every word, byte planes, zstd.

Layout (docs/snapshot-format.md, "Dense payload")::

    varint chunk_elements
    per chunk, per plane (least significant first): varint frame_length
    frames, chunk-major, plane-minor

Chunks are independent, so they decode in parallel and each thread holds one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec import planes
from hotload.snapshot.codec.frames import compress_plane, decompress_exact
from hotload.snapshot.codec.transforms import add_diff, zigzag_diff
from hotload.snapshot.codec.varint import Reader, write_varint
from hotload.snapshot.limits import MAX_CHUNK_ELEMENTS
from hotload.snapshot.manifest import CodecId


@dataclass(frozen=True)
class DenseChunk:
    """One chunk of a dense payload, located but not yet decompressed."""

    start: int
    length: int
    frames: tuple[memoryview, ...]


def chunk_bounds(numel: int, chunk_elements: int) -> list[tuple[int, int]]:
    return [(s, min(chunk_elements, numel - s)) for s in range(0, numel, chunk_elements)]


def chunk_planes(codec: CodecId, new: np.ndarray, old: np.ndarray | None) -> list[np.ndarray]:
    """The byte planes of one chunk's transformed words (numpy backend)."""
    if codec is CodecId.RAW:
        words = new
    elif old is None:
        raise ValueError(f"{codec} needs the previous words")
    elif codec is CodecId.DENSE_XOR:
        words = np.bitwise_xor(new, old)
    else:
        words = zigzag_diff(new, old)
    return planes.split(words)


def compress_chunk(chunk_planes: list[np.ndarray], level: int) -> list[bytes]:
    """The frames of one chunk, from its planes (whatever backend made them)."""
    return [compress_plane(plane, level) for plane in chunk_planes]


def encode_chunk(
    codec: CodecId, new: np.ndarray, old: np.ndarray | None, level: int
) -> list[bytes]:
    """The frames of one chunk: the transformed words' byte planes, compressed."""
    return compress_chunk(chunk_planes(codec, new, old), level)


def assemble(chunk_elements: int, chunks: list[list[bytes]]) -> bytes:
    head = bytearray()
    write_varint(chunk_elements, head)
    for frames in chunks:
        for frame in frames:
            write_varint(len(frame), head)
    return bytes(head) + b"".join(frame for frames in chunks for frame in frames)


def parse(payload: memoryview, numel: int, width: int, *, tensor: str) -> list[DenseChunk]:
    """Locate every chunk's frames, checking the layout against ``numel`` elements."""
    reader = Reader(payload)
    chunk_elements = reader.varint(limit=MAX_CHUNK_ELEMENTS, field="chunk_elements")
    if chunk_elements == 0:
        raise DecodeFailed("chunk_elements is zero", tensor=tensor)
    bounds = chunk_bounds(numel, chunk_elements)
    lengths = [
        [reader.varint(limit=len(payload), field="frame_length") for _ in range(width)]
        for _ in bounds
    ]
    chunks = [
        DenseChunk(start, length, tuple(reader.take(n, field="frame") for n in frame_lengths))
        for (start, length), frame_lengths in zip(bounds, lengths, strict=True)
    ]
    if reader.remaining():
        raise DecodeFailed("payload longer than its frames", tensor=tensor)
    return chunks


def decode_words(
    chunk: DenseChunk, word: np.dtype[np.unsignedinteger], *, tensor: str
) -> np.ndarray:
    """The chunk's transformed words (before the inverse transform is applied)."""
    data = [
        decompress_exact(frame, chunk.length, what=f"{tensor}@{chunk.start}")
        for frame in chunk.frames
    ]
    return planes.join(data, chunk.length, word)


def decode_chunk(codec: CodecId, chunk: DenseChunk, out: np.ndarray, *, tensor: str) -> None:
    """Rebuild ``out`` (this chunk's words, holding the previous bits for delta codecs)."""
    words = decode_words(chunk, out.dtype, tensor=tensor)
    if codec is CodecId.RAW:
        out[...] = words
    elif codec is CodecId.DENSE_XOR:
        np.bitwise_xor(out, words, out=out)
    else:
        add_diff(out, words)
