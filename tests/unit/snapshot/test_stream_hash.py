"""The split xxh3-128: a stream hashed in turns by several processes, the state carried
between them, gives exactly ``xxhash.xxh3_128_hexdigest`` of the whole stream.

Would catch: a stripe or block boundary handled differently from XXH3 (streams around
240, 1024 and 64-multiples, cut anywhere), a state that loses bytes in transit, the
native loop and the numpy fallback disagreeing, a corrupt state taken for a real one.
"""

from __future__ import annotations

import os

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hotload.snapshot.stream_hash import _NATIVE, StreamHash

LENGTHS = [0, 1, 16, 17, 128, 129, 239, 240, 241, 256, 1023, 1024, 1025, 1088, 2049, 70_001]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("length", LENGTHS)
def test_whole_streams_hash_as_xxh3_128(length: int, native: bool) -> None:
    data = os.urandom(length)
    state = StreamHash(native=native)
    state.update(data)
    assert state.hexdigest() == xxhash.xxh3_128_hexdigest(data)


def test_the_native_loop_is_built() -> None:
    """bootstrap builds it: without it a trainer hashes at numpy speed."""
    assert _NATIVE is not None


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 5000),
    st.lists(st.integers(0, 5000), max_size=5),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_a_stream_cut_anywhere_and_carried_between_processes_hashes_the_same(
    length: int, cuts: list[int], native: bool, seed: int
) -> None:
    data = seed.to_bytes(4, "little") * (length // 4 + 1)
    data = bytes(b ^ (i * 131 % 251) for i, b in enumerate(data[:length]))
    state = StreamHash(native=native)
    start = 0
    for cut in [*sorted(min(c, length) for c in cuts), length]:
        state.update(data[start:cut])
        start = cut
        state = StreamHash.from_bytes(state.to_bytes(), native=not native)
    assert state.hexdigest() == xxhash.xxh3_128_hexdigest(data)


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b[:10],
        lambda b: b"XXXX" + b[4:],
        lambda b: b + b"\0",
        lambda b: b[:-1],
    ],
)
@pytest.mark.parametrize("length", [100, 5000])
def test_a_damaged_state_is_refused(length: int, edit: object) -> None:
    state = StreamHash()
    state.update(os.urandom(length))
    with pytest.raises(ValueError, match="not a stream hash state"):
        StreamHash.from_bytes(edit(state.to_bytes()))  # type: ignore[operator]
