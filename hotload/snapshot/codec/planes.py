"""Byte planes: byte j of every word together, so like bytes compress together.

For bf16 the high plane holds sign and exponent (few distinct values, compresses
well) and the low plane the mantissa's low bits; interleaved, a compressor would see
neither pattern.
"""

from __future__ import annotations

import numpy as np


def split(words: np.ndarray, count: int | None = None) -> list[np.ndarray]:
    """The first ``count`` (default: all) byte planes of ``words``, least significant first."""
    width = words.dtype.itemsize
    count = width if count is None else count
    if width == 1:
        return [np.ascontiguousarray(words).view(np.uint8)]
    as_bytes = np.ascontiguousarray(words).view(np.uint8).reshape(-1, width)
    return [np.ascontiguousarray(as_bytes[:, j]) for j in range(count)]


def join(planes: list[bytes | None], length: int, word: np.dtype[np.unsignedinteger]) -> np.ndarray:
    """Words of ``word`` type from planes (``None``: an all-zero plane), least significant first."""
    width = word.itemsize
    if width == 1 and len(planes) == 1:
        plane = planes[0]
        if plane is None:
            return np.zeros(length, dtype=word)
        return np.frombuffer(plane, dtype=np.uint8, count=length).copy().view(word)
    out = np.zeros(length, dtype=word)
    as_bytes = out.view(np.uint8).reshape(length, width)
    for j, plane in enumerate(planes):
        if plane is not None:
            as_bytes[:, j] = np.frombuffer(plane, dtype=np.uint8, count=length)
    return out
