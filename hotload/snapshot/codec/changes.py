"""Which words of a tensor changed, and by how much: the encoder's one pass over its data.

Every delta candidate needs the same facts about a chunk: how many words differ from the
previous ones, where (positions in the chunk, increasing) and by how much (zigzag
differences); the ``context`` codec also needs how many previous words have each key
(its model's counts). The native kernel (``_context.scan_chunk``) gets them all in one
pass without the GIL; numpy, the fallback and the kernel's reference in the tests, takes
a pass per question. The encoder then builds ``sparse`` and ``context`` payloads from
these changes alone (plus the previous words' classes), so nothing else reads every word
of a tensor twice.

Positions and differences are kept only while the tensor's changes can still be coded
sparsely: once more than ``limit`` words have changed, the remaining chunks are only
counted, so memory stays proportional to what a sparse payload could hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from hotload.snapshot.codec import context_kernels
from hotload.snapshot.codec.jobs import map_jobs
from hotload.snapshot.codec.transforms import zigzag_diff


@dataclass(frozen=True)
class ChunkChanges:
    """The changes of elements ``[start, start + length)``."""

    start: int
    length: int
    count: int
    collected: bool
    """Whether ``positions`` and ``values`` hold the changes (else they are empty: the
    chunk was only counted)."""
    positions: np.ndarray
    """uint32 positions in the chunk, increasing."""
    values: np.ndarray
    """Their zigzag differences (words of the tensor's width)."""
    key_counts: np.ndarray | None
    """int64 count of the previous words per key; None when no key was asked for."""
    keys: np.ndarray | None = None
    """Each change's previous key (uint16, beside ``positions``) when the changes were
    collected and keys counted; else None."""


@dataclass(frozen=True)
class TensorChanges:
    chunks: tuple[ChunkChanges, ...]
    changed: int
    collected: bool
    """Whether every chunk's positions and differences were kept."""
    _kept: dict[object, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def values(self, word: np.dtype[np.unsignedinteger]) -> np.ndarray:
        """Every change's zigzag difference, in element order (made once)."""
        found = self._kept.get("values")
        if found is None:
            found = np.concatenate([np.zeros(0, dtype=word)] + [c.values for c in self.chunks])
            self._kept["values"] = found
        return found

    def magnitudes(self, word: np.dtype[np.unsignedinteger]) -> np.ndarray:
        """Every change's magnitude (uint64), in element order (made once)."""
        found = self._kept.get("magnitudes")
        if found is None:
            found = magnitudes_of(self.values(word))
            self._kept["magnitudes"] = found
        return found

    def previous_keys(self, previous: np.ndarray, key_shift: int, key_bits: int) -> np.ndarray:
        """Every change's previous key, in element order (made once per key)."""
        found = self._kept.get((key_shift, key_bits))
        if found is None:
            found = np.concatenate(
                [np.zeros(0, dtype=previous.dtype)]
                + [
                    keys_of(
                        previous[c.start : c.start + c.length][c.positions], key_shift, key_bits
                    )
                    for c in self.chunks
                    if c.count
                ]
            )
            self._kept[(key_shift, key_bits)] = found
        return found

    def key_counts(self) -> np.ndarray | None:
        """The previous words' keys counted over the whole tensor (None: none asked)."""
        total: np.ndarray | None = None
        for chunk in self.chunks:
            if chunk.key_counts is None:
                return None
            total = chunk.key_counts.copy() if total is None else total + chunk.key_counts
        return total


def magnitudes_of(values: np.ndarray) -> np.ndarray:
    """Each change's magnitude (uint64) from its zigzag difference."""
    magnitudes: np.ndarray = (values >> values.dtype.type(1)).astype(np.uint64) + (
        values & 1
    ).astype(np.uint64)
    return magnitudes


def keys_of(words: np.ndarray, key_shift: int, key_bits: int) -> np.ndarray:
    """Each word's key: ``(word >> key_shift) & (2**key_bits - 1)``."""
    kind = words.dtype.type
    keys: np.ndarray = (words >> kind(key_shift)) & kind((1 << key_bits) - 1)
    return keys


def scan_chunk(
    new: np.ndarray,
    old: np.ndarray,
    start: int,
    *,
    key_shift: int,
    key_bits: int,
    collect: bool,
    count_keys: bool,
    native: bool = context_kernels.NATIVE,
    simd: bool = True,
) -> ChunkChanges:
    """One chunk's changes (``new`` and ``old``: its words, same dtype and length).
    ``simd=False`` keeps the native scan on its portable loop (the same results)."""
    length = len(new)
    if native and context_kernels.NATIVE:
        from hotload.snapshot.codec import _context

        new = np.ascontiguousarray(new)
        old = np.ascontiguousarray(old)
        positions = np.empty(length if collect else 0, dtype=np.uint32)
        values = np.empty(length if collect else 0, dtype=new.dtype)
        counts = np.zeros(1 << key_bits if count_keys else 0, dtype=np.int64)
        keys = np.empty(length if collect and count_keys else 0, dtype=np.uint16)
        found = _context.scan_chunk(
            new.data,
            old.data,
            new.dtype.itemsize,
            key_shift,
            key_bits,
            positions.data,
            values.data,
            counts.data,
            simd,
            keys.data,
        )
        return ChunkChanges(
            start,
            length,
            found,
            collect,
            positions[:found].copy(),
            values[:found].copy(),
            counts if count_keys else None,
            keys[:found].copy() if collect and count_keys else None,
        )
    where = np.flatnonzero(new != old) if collect else np.zeros(0, dtype=np.int64)
    return ChunkChanges(
        start,
        length,
        len(where) if collect else int(np.count_nonzero(new != old)),
        collect,
        where.astype(np.uint32),
        zigzag_diff(new[where], old[where]),
        np.bincount(keys_of(old, key_shift, key_bits), minlength=1 << key_bits).astype(np.int64)
        if count_keys
        else None,
        keys_of(old[where], key_shift, key_bits).astype(np.uint16)
        if collect and count_keys
        else None,
    )


def scan_tensor(
    new: np.ndarray,
    old: np.ndarray,
    bounds: Sequence[tuple[int, int]],
    *,
    key_shift: int,
    key_bits: int,
    count_keys: bool,
    limit: int,
    executor: Executor | None = None,
    native: bool = context_kernels.NATIVE,
    simd: bool = True,
) -> TensorChanges:
    """Every chunk's changes; positions are kept while at most ``limit`` words changed."""
    lock = threading.Lock()
    seen = [0]

    def one(bound: tuple[int, int]) -> ChunkChanges:
        s, n = bound
        with lock:
            collect = seen[0] <= limit
        found = scan_chunk(
            new[s : s + n],
            old[s : s + n],
            s,
            key_shift=key_shift,
            key_bits=key_bits,
            collect=collect,
            count_keys=count_keys,
            native=native,
            simd=simd,
        )
        with lock:
            seen[0] += found.count
        return found

    run: Callable[[tuple[int, int]], ChunkChanges] = one
    chunks = tuple(map_jobs(executor, run, bounds))
    changed = sum(c.count for c in chunks)
    return TensorChanges(chunks, changed, all(c.collected for c in chunks))
