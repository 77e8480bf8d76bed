"""The element types the codec handles, by their safetensors names.

The codec works on bit patterns, so it only needs each dtype's width: a bf16 tensor is
handled as ``uint16`` words, fp8 as bytes. Types outside this table are refused by the
encoder (it cannot promise bit-exactness for them) and by the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from hotload.errors import DecodeFailed


@dataclass(frozen=True)
class DType:
    """One safetensors dtype: its name, its width in bytes, and the word type of its bits."""

    name: str
    width: int

    @property
    def word(self) -> np.dtype[np.unsignedinteger]:
        """The unsigned integer type whose values are this dtype's bit patterns."""
        word: np.dtype[np.unsignedinteger] = np.dtype(_WORDS[self.width])
        return word


_WORDS: Final[dict[int, type[np.unsignedinteger]]] = {
    1: np.uint8,
    2: np.uint16,
    4: np.uint32,
    8: np.uint64,
}

DTYPES: Final[dict[str, DType]] = {
    dtype.name: dtype
    for dtype in (
        DType("BF16", 2),
        DType("F16", 2),
        DType("F32", 4),
        DType("F64", 8),
        DType("F8_E4M3", 1),
        DType("F8_E5M2", 1),
        DType("I8", 1),
        DType("U8", 1),
        DType("I16", 2),
        DType("U16", 2),
        DType("I32", 4),
        DType("U32", 4),
        DType("I64", 8),
        DType("U64", 8),
        DType("BOOL", 1),
    )
}
"""Every dtype the format accepts (docs/snapshot-format.md, "Dtypes")."""


def dtype_named(name: str, *, tensor: str | None = None) -> DType:
    """The :class:`DType` called ``name``; :class:`DecodeFailed` for any other name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise DecodeFailed("unsupported dtype", dtype=name, tensor=tensor) from None
