"""The context codec's model: how a previous value picks a class, and each class's codes.

A tensor's elements fall into up to :data:`MAX_CLASSES` classes by a *key* read from
their previous bits (``(word >> key_shift) & (2**key_bits - 1)``: for floats, the
exponent, which sets the unit in the last place and so how likely an RL step moves the
element). Keys below ``lo`` share class 0, keys ``lo .. lo + classes - 3`` get a class
each, keys above share the last class. Per class: the Golomb parameter of its gaps and
how its change magnitudes are coded (all ±1, or Exp-Golomb of order ``value_k``).

:func:`choose_model` fits one to a tensor's changes from per-key counts; the layout
(:func:`write_model`, :func:`read_model`) is docs/snapshot-format.md's "Context payload".
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec.varint import Reader, write_varint

try:
    from hotload.snapshot.codec import _context
except ImportError:  # pragma: no cover - depends on how the checkout was installed
    _context = None  # type: ignore[assignment]

MAX_CLASSES: Final = 8
MAX_KEY_BITS: Final = 12
MAX_GOLOMB: Final = 1 << 32
MAX_VALUE_K: Final = 62
UNIT_MAGNITUDES: Final = 255
"""``value_k`` of a class whose changes are all ±1 unit: only a sign bit per change."""

#: (key_shift, key_bits) per dtype: the exponent field of each float type.
EXPONENT_KEYS: Final[dict[str, tuple[int, int]]] = {
    "BF16": (7, 8),
    "F16": (10, 5),
    "F32": (23, 8),
    "F64": (52, 11),
    "F8_E4M3": (3, 4),
    "F8_E5M2": (2, 5),
}


@dataclass(frozen=True)
class ContextModel:
    key_shift: int
    key_bits: int
    lo: int
    golomb: tuple[int, ...]
    value_k: tuple[int, ...]

    @property
    def classes(self) -> int:
        return len(self.golomb)

    def golomb_bytes(self) -> bytes:
        return struct.pack(f"<{len(self.golomb)}Q", *self.golomb)

    def value_k_bytes(self) -> bytes:
        return bytes(self.value_k)


def write_model(model: ContextModel, into: bytearray) -> None:
    into.append(model.key_shift)
    into.append(model.key_bits)
    write_varint(model.lo, into)
    into.append(model.classes)
    for m, k in zip(model.golomb, model.value_k, strict=True):
        write_varint(m, into)
        into.append(k)


def read_model(reader: Reader, width: int, *, tensor: str) -> ContextModel:
    """The model at the reader's position, every field checked against its limit."""
    key_shift = reader.byte(field="key_shift")
    key_bits = reader.byte(field="key_bits")
    if key_bits > MAX_KEY_BITS or key_shift + key_bits > 8 * width:
        raise DecodeFailed(
            "context key outside the word", tensor=tensor, shift=key_shift, bits=key_bits
        )
    lo = reader.varint(limit=1 << key_bits, field="lo")
    classes = reader.byte(field="classes")
    if not 1 <= classes <= MAX_CLASSES:
        raise DecodeFailed("context classes must be 1..8", tensor=tensor, found=classes)
    golomb: list[int] = []
    value_k: list[int] = []
    for _ in range(classes):
        m = reader.varint(limit=MAX_GOLOMB, field="golomb")
        if m == 0:
            raise DecodeFailed("context Golomb parameter is zero", tensor=tensor)
        k = reader.byte(field="value_k")
        if k > MAX_VALUE_K and k != UNIT_MAGNITUDES:
            raise DecodeFailed("context value order out of range", tensor=tensor, found=k)
        golomb.append(m)
        value_k.append(k)
    return ContextModel(key_shift, key_bits, lo, tuple(golomb), tuple(value_k))


def golomb_parameter(changes: int, elements: int) -> int:
    """The optimal Golomb parameter for gaps of a geometric source (Gallager, van Voorhis)."""
    if elements <= 0:
        return 1
    if changes <= 0:
        return max(1, min(elements, MAX_GOLOMB))
    p = min(changes / (elements + 1), 0.999999)
    return max(1, min(math.ceil(math.log(2 - p) / -math.log1p(-p)), MAX_GOLOMB))


def exp_golomb_lengths(values: np.ndarray, k: int) -> np.ndarray:
    """Bits of each value's Exp-Golomb code of order ``k``."""
    shifted = values.astype(np.float64) + float(1 << k)
    n = np.floor(np.log2(shifted)).astype(np.int64)
    return 2 * n - k + 1


def value_order(magnitudes: np.ndarray) -> int:
    """:data:`UNIT_MAGNITUDES` when every magnitude is 1, else the cheapest Exp-Golomb order."""
    return value_orders(magnitudes, np.zeros(len(magnitudes), dtype=np.int64), 1)[0]


def value_orders(
    magnitudes: np.ndarray, change_class: np.ndarray, classes: int, *, native: bool = True
) -> tuple[int, ...]:
    """:func:`value_order` of each class's magnitudes (``change_class``: each change's
    class), for every class at once: each order's cost is the lengths of the distinct
    magnitudes times how often each class has them. The lowest order wins a tie.

    Natively in one pass where the magnitudes allow integer lengths (all but 8-byte words'
    largest: ``_context.value_orders``); the same orders (the tests compare them)."""
    if native and hasattr(_context, "value_orders"):  # built, and from this source
        found = _context.value_orders(
            np.ascontiguousarray(magnitudes, dtype=np.uint64).data,
            np.ascontiguousarray(change_class, dtype=np.int64).data,
            classes,
        )
        if found is not None:
            return tuple(found)
    orders = [UNIT_MAGNITUDES] * classes
    if len(magnitudes) == 0 or int(magnitudes.max()) <= 1:
        return tuple(orders)
    above = magnitudes.astype(np.uint64) - np.uint64(1)
    change_class = change_class.astype(np.int64)
    # a class is coded with an order when one of its magnitudes is above 1
    coded = np.bincount(change_class[magnitudes > 1], minlength=classes) > 0
    values, counts = _value_counts(above, change_class, classes)
    counts[~coded] = 0
    last = counts.shape[1] - 1 - np.argmax(counts[:, ::-1] > 0, axis=1)
    tops = [min(MAX_VALUE_K, int(values[last[c]]).bit_length()) for c in range(classes)]
    cost = exp_golomb_table(values, max(tops)) @ counts.T
    for c in np.flatnonzero(coded).tolist():
        orders[c] = int(np.argmin(cost[: tops[c] + 1, c]))
    return tuple(orders)


def _value_counts(
    values: np.ndarray, value_class: np.ndarray, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, increasing; how often each class has each: classes rows)."""
    biggest = int(values.max())
    if biggest < 1 << 16:  # small magnitudes (2-byte words): one table of counts
        width = biggest + 1
        table = np.bincount(
            value_class * width + values.astype(np.int64), minlength=classes * width
        ).reshape(classes, width)
        present = np.flatnonzero(table.any(axis=0))
        return present.astype(np.uint64), table[:, present]
    distinct, inverse = np.unique(values, return_inverse=True)
    counts = np.zeros((classes, len(distinct)), dtype=np.int64)
    np.add.at(counts, (value_class, inverse.reshape(-1)), 1)
    return distinct, counts


def exp_golomb_table(values: np.ndarray, top: int) -> np.ndarray:
    """:func:`exp_golomb_lengths` of ``values`` for every order ``0..top`` (one row each),
    by the same float arithmetic."""
    shifts = np.array([float(1 << k) for k in range(top + 1)])
    shifted = values.astype(np.float64)[None, :] + shifts[:, None]
    n = np.floor(np.log2(shifted)).astype(np.int64)
    lengths: np.ndarray = 2 * n - np.arange(top + 1)[:, None] + 1
    return lengths


def _entropy_bits(changes: np.ndarray, elements: np.ndarray) -> np.ndarray:
    """``n · h(k / n)`` bits, elementwise: the cost of coding which of n elements changed."""
    k = changes.astype(np.float64)
    n = elements.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, k / np.maximum(n, 1), 0.0)
        h = -(p * np.log2(np.where(p > 0, p, 1)) + (1 - p) * np.log2(np.where(p < 1, 1 - p, 1)))
    result: np.ndarray = n * h
    return result


def _prefix_sums(values: np.ndarray, dtype: type) -> np.ndarray:
    """0, then the running sums of ``values`` (one element longer)."""
    out: np.ndarray = np.zeros(len(values) + 1, dtype=dtype)
    np.cumsum(values, out=out[1:])
    return out


def class_counts(per_key: np.ndarray, lo: int, classes: int) -> np.ndarray:
    """Per-class totals of per-key counts for a model with ``lo`` and ``classes``."""
    keys = np.arange(len(per_key))
    index = np.clip(keys - lo + 1, 0, classes - 1)
    return np.bincount(index, weights=per_key, minlength=classes).astype(np.int64)


def choose_model(
    per_key: np.ndarray | None,
    elements: int,
    changed_keys: np.ndarray,
    magnitudes: np.ndarray,
    *,
    key_shift: int,
    key_bits: int,
    classes: int,
    native: bool = True,
) -> ContextModel:
    """The model with ``classes`` classes (1: no context) that minimises the changes'
    estimated entropy: ``per_key`` counts every element's key (None without a key),
    ``changed_keys`` and ``magnitudes`` describe the changed elements.

    The window's arithmetic runs natively where built (``_context.model_prepare`` and
    ``model_finish``, around numpy's log2): the same model (the tests compare them)."""
    changes = len(changed_keys)
    if classes <= 1 or key_bits == 0 or per_key is None or changes == 0:
        unit = np.zeros(changes, dtype=np.int64)
        return _fitted(0, 0, 0, [elements], [changes], unit, magnitudes)
    size = 1 << key_bits
    classes = min(classes, MAX_CLASSES, size + 2)
    changed = np.bincount(changed_keys, minlength=size)[:size]
    per_key = per_key[:size]
    if native and hasattr(_context, "model_prepare"):  # built, and from this source
        lo, class_elements, class_changes = _native_window(per_key, changed, classes)
    else:
        lo, class_elements, class_changes = _window(per_key, changed, classes)
    # each key's class (np.clip's own checks cost more than the work here)
    index = np.minimum(np.maximum(np.arange(1 - lo, size + 1 - lo), 0), classes - 1)
    return _fitted(
        key_shift, key_bits, lo, class_elements, class_changes, index[changed_keys], magnitudes
    )


def fit_changes(
    values: Sequence[np.ndarray],
    keys: Sequence[np.ndarray | None],
    per_key: np.ndarray | None,
    elements: int,
    *,
    key_shift: int,
    key_bits: int,
    classes: int,
) -> ContextModel | None:
    """:func:`choose_model`'s model, natively, from what the scan found per chunk: its
    changes' zigzag differences (``values``: words) and previous keys (``keys``: uint16),
    without the arrays :func:`choose_model` takes (each change's class and magnitude are
    read where they lie). None when the native kernels are not built, a chunk's keys are
    missing, or a magnitude is too large for exact integer code lengths: the caller fits
    with :func:`choose_model` then."""
    if not hasattr(_context, "fit_finish") or not values:  # built, and from this source
        return None
    width = values[0].dtype.itemsize
    words = [v.data for v in values]
    if classes <= 1 or key_bits == 0 or per_key is None:
        fitted = _context.fit_finish(words, width, None, elements, None)
        key_shift = key_bits = 0
    else:
        present = [k.data for k in keys if k is not None]
        if len(present) != len(keys):
            return None
        size = 1 << key_bits
        counts = np.ascontiguousarray(per_key[:size], dtype=np.int64)
        classes = min(classes, MAX_CLASSES)
        changed, first, count, rows = _context.fit_prepare(present, counts.data, classes)
        logs = np.log2(np.frombuffer(rows, dtype=np.float64).reshape(4, -1)[1:3])
        window = (rows, logs.data, counts.data, changed, first, count, min(classes, size + 2))
        fitted = _context.fit_finish(words, width, present, elements, window)
    if fitted is None:
        return None
    lo, golomb, value_k = fitted
    return ContextModel(key_shift, key_bits, lo, golomb, value_k)


Window = tuple[int, Sequence[int], Sequence[int]]


def _window(per_key: np.ndarray, changed: np.ndarray, classes: int) -> Window:
    """(lo, elements and changes per class) of the cheapest window of ``classes`` classes."""
    size = len(per_key)
    present = np.flatnonzero(changed)
    first, last = int(present[0]), int(present[-1])
    # cost(lo) = tail below lo + one class per key in [lo, lo + classes - 2) + tail above,
    # for every candidate lo at once from prefix sums
    n_before = _prefix_sums(per_key, np.int64)
    c_before = _prefix_sums(changed, np.int64)
    los = np.arange(max(0, first - 1), min(size, max(first, last - classes + 4)) + 1)
    tops = np.minimum(los + classes - 2, size)
    # the three entropies in one call (elementwise: the same bits as three calls)
    count = len(los)
    bits = _entropy_bits(
        np.concatenate((changed, c_before[los], c_before[size] - c_before[tops])),
        np.concatenate((per_key, n_before[los], n_before[size] - n_before[tops])),
    )
    h_before = _prefix_sums(bits[:size], np.float64)
    cost = bits[size : size + count] + (h_before[tops] - h_before[los]) + bits[size + count :]
    lo = int(los[int(np.argmin(cost))])
    index = np.clip(np.arange(size) - lo + 1, 0, classes - 1)
    class_elements = np.bincount(index, weights=per_key, minlength=classes).astype(np.int64)
    class_changes = np.bincount(index, weights=changed, minlength=classes).astype(np.int64)
    return lo, class_elements.tolist(), class_changes.tolist()


def _native_window(per_key: np.ndarray, changed: np.ndarray, classes: int) -> Window:
    """:func:`_window` with its arithmetic in C and numpy's log2 between."""
    per_key = np.ascontiguousarray(per_key, dtype=np.int64)
    changed = np.ascontiguousarray(changed, dtype=np.int64)
    first, count, rows = _context.model_prepare(per_key.data, changed.data, classes)
    table = np.frombuffer(rows, dtype=np.float64).reshape(4, len(per_key) + 2 * count)
    logs = np.log2(table[1:3])  # rows a and b: what _entropy_bits takes log2 of
    window: Window = _context.model_finish(
        rows, logs.data, per_key.data, changed.data, first, count, classes
    )
    return window


def _fitted(
    key_shift: int,
    key_bits: int,
    lo: int,
    elements: Sequence[int],
    changes: Sequence[int],
    change_class: np.ndarray,
    magnitudes: np.ndarray,
) -> ContextModel:
    golomb = tuple(golomb_parameter(k, n) for k, n in zip(changes, elements, strict=True))
    value_k = value_orders(magnitudes, change_class, len(elements))
    return ContextModel(key_shift, key_bits, lo, golomb, value_k)
