"""Reversible word transforms against the previous bits: XOR and zigzag difference.

Both are exact on bit patterns, whatever the dtype means. The zigzag of the wrapping
difference turns a move of one unit in the last place (the common case at RL learning
rates: an fp32 master weight crossing one bf16 rounding boundary) into 1 or 2, whatever
the carries, where XOR would give 1, 3, 7, ... depending on the low bits.
"""

from __future__ import annotations

import numpy as np

try:
    from hotload.snapshot.codec import _context
except ImportError:  # pragma: no cover - depends on how the checkout was installed
    _context = None  # type: ignore[assignment]

_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def zigzag_diff(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """``zigzag(new - old)`` on unsigned words (wrapping): 0 ↦ 0, +1 ↦ 2, -1 ↦ 1, ..."""
    diff = np.subtract(new, old, dtype=new.dtype)
    signed = diff.view(_SIGNED[new.dtype.itemsize])
    bits = new.dtype.itemsize * 8
    zig: np.ndarray = ((signed << 1) ^ (signed >> (bits - 1))).view(new.dtype)
    return zig


def unzigzag(zig: np.ndarray) -> np.ndarray:
    """The wrapping difference whose zigzag is ``zig``."""
    low = zig & 1
    np.negative(low, out=low)
    return (zig >> 1) ^ low


def add_diff(out: np.ndarray, zig: np.ndarray) -> None:
    """``out += unzigzag(zig)`` in place, wrapping."""
    np.add(out, unzigzag(zig), out=out, casting="unsafe")


def apply_changes(
    out: np.ndarray, positions: np.ndarray, zig: np.ndarray, *, native: bool = True
) -> np.ndarray:
    """``out[positions] += unzigzag(zig)`` in place (wrapping); returns the words that were
    there (a patch's undo record). ``zig`` may be consumed (natively, the previous words
    are written over it). A position outside ``out`` raises ValueError (natively before
    any write; numpy's IndexError is raised as one)."""
    if (
        native
        and _context is not None
        and out.flags.c_contiguous
        and out.flags.writeable
        and zig.dtype == out.dtype
        and positions.dtype in (np.uint32, np.int64)
    ):
        zig = np.ascontiguousarray(zig)
        if not zig.flags.writeable:
            zig = zig.copy()
        positions = np.ascontiguousarray(positions)
        _context.apply_changes(
            out.data, out.dtype.itemsize, positions.data, positions.dtype.itemsize, zig.data
        )
        return zig
    try:
        before: np.ndarray = out[positions]
    except IndexError as err:
        raise ValueError(
            f"apply_changes: a change's position lies outside the words ({err})"
        ) from None
    out[positions] = before + unzigzag(zig)
    return before
