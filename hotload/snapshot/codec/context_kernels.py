"""The context codec's chunk kernels: native when built, else the Python reference.

``pip install`` (and ``python setup.py build_ext --inplace`` in a work tree) compiles
``_context.c``; without it every context-coded tensor still encodes and decodes, to the
same bytes, at Python speed (:mod:`~hotload.snapshot.codec.context_reference`). Errors
of a malformed stream are :class:`~hotload.errors.DecodeFailed` either way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec import context_reference
from hotload.snapshot.codec.context_model import ContextModel

log = logging.getLogger(__name__)

#: What this source's module defines: one built from an older _context.c lacks some.
ENTRY_POINTS: Final = (
    "decode_chunk",
    "encode_chunk",
    "apply_changes",
    "scan_chunk",
    "value_orders",
    "model_prepare",
    "model_finish",
    "fit_prepare",
    "fit_finish",
    "stream_lengths",
    "sparse_planes",
)

try:
    from hotload.snapshot.codec import _context

    _BUILT = all(hasattr(_context, name) for name in ENTRY_POINTS)
except ImportError:  # pragma: no cover - depends on how the checkout was installed
    _BUILT = False
if not _BUILT:  # pragma: no cover - depends on how the checkout was installed
    log.warning(
        "the context codec's native kernels are not built (or were built from an older "
        "source): context-coded tensors run at Python speed (pip install the package, or "
        "python setup.py build_ext --inplace)"
    )

NATIVE: Final = _BUILT
"""Whether the native kernels are in use."""

SIMD: Final = _BUILT and bool(_context.SIMD)
"""Whether the native decode takes its AVX2 path on this CPU (the portable loop else)."""


def decode_chunk(
    previous: np.ndarray,
    model: ContextModel,
    stream: bytes | memoryview,
    changes: int,
    *,
    what: str,
    native: bool = NATIVE,
    simd: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the chunk as uint32, zigzag differences as words) of its changes.

    ``previous`` holds the chunk's previous words (C-contiguous, unsigned). ``simd=False``
    keeps the native kernel on its portable loop (same results: tests compare all three).
    """
    previous = np.ascontiguousarray(previous)
    try:
        if native and NATIVE:
            positions = np.empty(changes, dtype=np.uint32)
            values = np.empty(changes, dtype=previous.dtype)
            _context.decode_chunk(
                previous.data,
                previous.dtype.itemsize,
                model.key_shift,
                model.key_bits,
                model.lo,
                model.golomb_bytes(),
                model.value_k_bytes(),
                stream,
                changes,
                positions.data,
                values.data,
                simd,
            )
            return positions, values
        return context_reference.decode_chunk(previous, model, bytes(stream), changes)
    except ValueError as err:
        raise DecodeFailed(f"corrupt context stream: {err}", what=what) from None


def encode_chunk(
    previous: np.ndarray,
    model: ContextModel,
    positions: np.ndarray,
    values: np.ndarray,
    *,
    native: bool = NATIVE,
    simd: bool = True,
) -> bytes:
    """The chunk's stream; ``positions`` (uint32, increasing) index ``previous``.

    ``simd=False`` keeps the native kernel on its portable scan (same bytes: tests compare
    all three)."""
    previous = np.ascontiguousarray(previous)
    positions = np.ascontiguousarray(positions, dtype=np.uint32)
    values = np.ascontiguousarray(values, dtype=previous.dtype)
    if native and NATIVE:
        stream: bytes = _context.encode_chunk(
            previous.data,
            previous.dtype.itemsize,
            model.key_shift,
            model.key_bits,
            model.lo,
            model.golomb_bytes(),
            model.value_k_bytes(),
            positions.data,
            values.data,
            simd,
        )
        return stream
    return context_reference.encode_chunk(previous, model, positions, values)


def stream_lengths(
    positions: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    lengths: Sequence[int],
    model: ContextModel,
) -> tuple[int, ...] | None:
    """The length of :func:`encode_chunk`'s stream for each chunk (``positions``: uint32,
    increasing, in a chunk of ``lengths`` elements; at least one change each) under a
    model of one class without a key, computed without writing it. None where the kernels
    are not built, the model has a key, or the kernel would refuse a change (the caller
    writes the streams then, and gets the same bytes or the same error)."""
    if not NATIVE or model.key_bits or model.classes != 1 or not positions:
        return None
    found: tuple[int, ...] | None = _context.stream_lengths(
        [np.ascontiguousarray(p, dtype=np.uint32).data for p in positions],
        [np.ascontiguousarray(v).data for v in values],
        np.asarray(lengths, dtype=np.uint64).data,
        values[0].dtype.itemsize,
        model.golomb[0],
        model.value_k[0],
    )
    return found
