"""The baselines, measured on the same data in the same run.

- zstd of the full snapshot (its tensor bytes), level 3;
- zstd of the raw bitwise difference (XOR of all tensors' bits), level 3;
- the sparse scheme published for RL weight sync: bitwise difference → positions of
  the non-zero elements, delta-encoded in the narrowest unsigned integer type that
  holds every gap → zstd (level 3), beside the changed XOR values → zstd (level 3);
- ZipNN on the full snapshot, when it imports.
Each returns stored bytes and, where it is meaningful, decode seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import zstandard

LEVEL = 3


@dataclass(frozen=True)
class Measured:
    stored_bytes: int
    decode_seconds: float | None = None
    exact: bool | None = None


def zstd_full(words: np.ndarray) -> Measured:
    frame = zstandard.ZstdCompressor(level=LEVEL).compress(words.tobytes())
    start = time.perf_counter()
    back = zstandard.ZstdDecompressor().decompress(frame)
    seconds = time.perf_counter() - start
    return Measured(len(frame), seconds, back == words.tobytes())


def zstd_xor(xor: np.ndarray) -> Measured:
    return Measured(len(zstandard.ZstdCompressor(level=LEVEL).compress(xor.tobytes())))


def sparse_scheme(xor: np.ndarray, previous: np.ndarray, current: np.ndarray) -> Measured:
    positions = np.flatnonzero(xor)
    gaps = np.diff(positions, prepend=0)
    top = int(gaps.max()) if len(gaps) else 0
    gap_type = np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.uint32
    cctx = zstandard.ZstdCompressor(level=LEVEL)
    gap_frame = cctx.compress(gaps.astype(gap_type).tobytes())
    value_frame = cctx.compress(xor[positions].tobytes())
    start = time.perf_counter()
    dctx = zstandard.ZstdDecompressor()
    decoded_gaps = np.frombuffer(dctx.decompress(gap_frame), dtype=gap_type)
    values = np.frombuffer(dctx.decompress(value_frame), dtype=np.uint16)
    rebuilt = previous.copy()
    where = np.cumsum(decoded_gaps, dtype=np.int64)
    rebuilt[where] ^= values
    seconds = time.perf_counter() - start
    return Measured(
        len(gap_frame) + len(value_frame), seconds, bool(np.array_equal(rebuilt, current))
    )


def zipnn_full(words: np.ndarray) -> Measured | None:
    try:
        import zipnn
    except Exception:  # the baseline is optional: "ZipNN if it installs"
        return None
    data = words.tobytes()
    codec = zipnn.ZipNN(bytearray_dtype="bfloat16", threads=1, input_format="byte")
    frame = codec.compress(data)
    start = time.perf_counter()
    back = codec.decompress(frame)
    seconds = time.perf_counter() - start
    return Measured(len(frame), seconds, bytes(back) == data)
