"""An in-place patch decoding each tensor's chunks on a thread pool is the sequential
patch, bit for bit, and still all or nothing (every chunk job finished before the undo)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hotload.errors import ChecksumMismatch, DecodeFailed
from hotload.snapshot import patch_tensors

from . import tampering
from .conftest import Chain
from .models import base_tensors, next_step, nudge


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=3) as executor:
        yield executor


def held_v1() -> dict[str, np.ndarray]:
    return {name: data.copy() for name, (_, data) in base_tensors().items()}


def test_parallel_chunks_give_the_next_snapshot_and_the_same_ranges(
    chain: Chain, pool: ThreadPoolExecutor
) -> None:
    told: dict[str, list[tuple[str, int, tuple[int, ...] | None, int]]] = {}
    results = {}
    for mode, executor in (("sequential", None), ("parallel", pool)):
        held = held_v1()
        heard = told.setdefault(mode, [])
        patch_tensors(
            held,
            chain.snapshot,
            executor=executor,
            on_change=lambda n, s, p, length, heard=heard: heard.append(
                (n, s, None if p is None else tuple(p.tolist()), length)
            ),
        )
        results[mode] = held
    expected = {name: data for name, (_, data) in next_step(base_tensors()).items()}
    for mode, held in results.items():
        for name, data in expected.items():
            assert np.array_equal(held[name].reshape(-1), data.reshape(-1)), (mode, name)
    assert len({n for n, *_ in told["parallel"]}) > 1
    assert sorted(told["parallel"], key=repr) == sorted(told["sequential"], key=repr)
    chunked = [n for n, start, *_ in told["parallel"] if start > 0]
    assert chunked, "the chain's tensors span several chunks (else nothing ran in parallel)"


def test_parallel_patch_on_wrong_weights_is_undone(chain: Chain, pool: ThreadPoolExecutor) -> None:
    held = {name: nudge(data, 0.1, 7) for name, (_, data) in base_tensors().items()}
    before = {name: array.copy() for name, array in held.items()}
    with pytest.raises(ChecksumMismatch):
        patch_tensors(held, chain.snapshot, executor=pool)
    assert all(np.array_equal(held[n], before[n]) for n in before)


def test_a_corrupt_chunk_amid_parallel_ones_is_undone_whole(
    chain: Chain, pool: ThreadPoolExecutor
) -> None:
    """A flipped byte in the largest tensor's payload, behind a re-signed manifest: its
    other chunks decode (in parallel) and write; the failure undoes them all."""
    document = tampering.load(chain.snapshot)
    entry = tampering.tensor(document, "embed.weight")
    payload = bytearray(tampering.read_range(chain.snapshot, entry["data"]))
    payload[len(payload) // 2] ^= 0x40
    tampering.replace_range(chain.snapshot, entry["data"], bytes(payload))
    tampering.resign(chain.snapshot, lambda d: d.update(tensors=document["tensors"]))
    held = held_v1()
    before = {name: array.copy() for name, array in held.items()}
    with pytest.raises((DecodeFailed, ChecksumMismatch)):
        patch_tensors(held, chain.snapshot, executor=pool)
    assert all(np.array_equal(held[n], before[n]) for n in before)
