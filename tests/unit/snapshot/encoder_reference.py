"""Today's tensor encoder, frozen: the oracle the encoder's faster paths must match.

The encoder as it was before its native path (commit d2baf31): whole-tensor numpy passes
(``encode_tensor(..., native=False)``), the context model fitted by the code below
(verbatim from that commit: one ``value_order`` per class, three entropy calls, the
prefix sums by concatenation) and the chunk streams written by the Python kernel
(``context_reference``, the specification the native kernels were tested against). Slow,
and kept only for the tests: the encoder itself no longer runs any of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from hotload.snapshot.codec import context, context_kernels
from hotload.snapshot.codec.context_model import (
    MAX_CLASSES,
    MAX_VALUE_K,
    UNIT_MAGNITUDES,
    ContextModel,
    _entropy_bits,
    exp_golomb_lengths,
    golomb_parameter,
)
from hotload.snapshot.codec.tensor_codec import CodecOptions, EncodedTensor, encode_tensor


def value_order(magnitudes: np.ndarray) -> int:
    if len(magnitudes) == 0 or int(magnitudes.max()) <= 1:
        return UNIT_MAGNITUDES
    above = magnitudes.astype(np.uint64) - np.uint64(1)
    top = min(MAX_VALUE_K, max(0, int(above.max()).bit_length()))
    return min(range(top + 1), key=lambda k: int(exp_golomb_lengths(above, k).sum()))


def choose_model(
    per_key: np.ndarray | None,
    elements: int,
    changed_keys: np.ndarray,
    magnitudes: np.ndarray,
    **model: int,
) -> ContextModel:
    key_shift, key_bits, classes = model["key_shift"], model["key_bits"], model["classes"]
    changes = len(changed_keys)
    if classes <= 1 or key_bits == 0 or per_key is None or changes == 0:
        unit = np.zeros(changes, dtype=np.int64)
        return _fitted(0, 0, 0, np.array([elements]), np.array([changes]), unit, magnitudes)
    size = 1 << key_bits
    classes = min(classes, MAX_CLASSES, size + 2)
    changed = np.bincount(changed_keys, minlength=size)[:size]
    per_key = per_key[:size]
    present = np.flatnonzero(changed)
    first, last = int(present[0]), int(present[-1])
    n_before = np.concatenate([[0], np.cumsum(per_key)])
    c_before = np.concatenate([[0], np.cumsum(changed)])
    h_before = np.concatenate([[0.0], np.cumsum(_entropy_bits(changed, per_key))])
    los = np.arange(max(0, first - 1), min(size, max(first, last - classes + 4)) + 1)
    tops = np.minimum(los + classes - 2, size)
    cost = (
        _entropy_bits(c_before[los], n_before[los])
        + (h_before[tops] - h_before[los])
        + _entropy_bits(c_before[size] - c_before[tops], n_before[size] - n_before[tops])
    )
    lo = int(los[int(np.argmin(cost))])
    index = np.clip(np.arange(size) - lo + 1, 0, classes - 1)
    class_elements = np.bincount(index, weights=per_key, minlength=classes).astype(np.int64)
    class_changes = np.bincount(index, weights=changed, minlength=classes).astype(np.int64)
    return _fitted(
        key_shift, key_bits, lo, class_elements, class_changes, index[changed_keys], magnitudes
    )


def _fitted(
    key_shift: int,
    key_bits: int,
    lo: int,
    elements: np.ndarray,
    changes: np.ndarray,
    change_class: np.ndarray,
    magnitudes: np.ndarray,
) -> ContextModel:
    golomb = tuple(golomb_parameter(int(k), int(n)) for k, n in zip(changes, elements, strict=True))
    value_k = tuple(value_order(magnitudes[change_class == c]) for c in range(len(elements)))
    return ContextModel(key_shift, key_bits, lo, golomb, value_k)


@contextmanager
def reference_fitting() -> Iterator[None]:
    """The context codec fits models and writes streams as before (one thread only)."""
    fitting, kernel = context.choose_model, context_kernels.encode_chunk

    def python_kernel(*args: Any, **kwargs: Any) -> bytes:
        kwargs.pop("simd", None)
        return kernel(*args, **kwargs, native=False)

    context.choose_model = choose_model  # type: ignore[assignment]
    context_kernels.encode_chunk = python_kernel  # type: ignore[assignment]
    try:
        yield
    finally:
        context.choose_model = fitting  # type: ignore[assignment]
        context_kernels.encode_chunk = kernel  # type: ignore[assignment]


def reference_encode(
    new: np.ndarray, old: np.ndarray | None, options: CodecOptions, *, dtype: str | None
) -> EncodedTensor:
    """What the encoder of d2baf31 wrote for this tensor."""
    with reference_fitting():
        return encode_tensor(new, old, options, dtype=dtype, native=False)
