"""Entropy bounds of a bf16 update (CONTRACTS.md, "Benchmarks").

- order-0: the empirical entropy of the per-element XOR stream, one 16-bit symbol per
  element, times the number of elements;
- exponent-conditioned: the same, conditioned on the previous value's exponent (which
  the decoder holds);
- changed-limit: the entropy of what changed: the change mask (binary entropy of the
  changed fraction, per element) plus the order-0 entropy of the changed XOR values.
All in bytes; a ratio bound is the full tensor bytes divided by one of them.
"""

from __future__ import annotations

import numpy as np


def _entropy_bits(counts: np.ndarray) -> float:
    counts = counts[counts > 0].astype(np.float64)
    total = counts.sum()
    p = counts / total
    return float(-(counts * np.log2(p)).sum())


def order0_bytes(xor: np.ndarray) -> float:
    return _entropy_bits(np.bincount(xor, minlength=1 << 16)) / 8


def exponent_conditioned_bytes(xor: np.ndarray, previous: np.ndarray) -> float:
    exponent = ((previous >> 7) & 0xFF).astype(np.int64)
    joint = np.bincount((exponent << 16) | xor, minlength=256 << 16).reshape(256, 1 << 16)
    return sum(_entropy_bits(row) for row in joint if row.any()) / 8


def changed_limit_bytes(xor: np.ndarray) -> float:
    changed = xor[xor != 0]
    n, k = len(xor), len(changed)
    mask = _entropy_bits(np.array([n - k, k]))
    return (mask + (_entropy_bits(np.bincount(changed, minlength=1 << 16)) if k else 0)) / 8
