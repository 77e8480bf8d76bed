"""The per-tensor codecs: exact round trips for every dtype width, and robustness."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotload.errors import DecodeFailed
from hotload.snapshot import CodecId, CodecOptions
from hotload.snapshot.codec.tensor_codec import decode_tensor, encode_tensor
from hotload.snapshot.codec.transforms import apply_changes, unzigzag, zigzag_diff
from hotload.snapshot.codec.varint import Reader, write_varint

WORDS = [np.uint8, np.uint16, np.uint32, np.uint64]
DELTA_CODECS = [CodecId.SPARSE, CodecId.DENSE_SUB, CodecId.DENSE_XOR, CodecId.RAW]


@st.composite
def tensor_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    word = draw(st.sampled_from(WORDS))
    size = draw(st.integers(0, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    info = np.iinfo(word)
    old = rng.integers(0, info.max, size=size, dtype=word, endpoint=True)
    new = old.copy()
    fraction = draw(st.sampled_from([0.0, 0.001, 0.01, 0.2, 0.9, 1.0]))
    count = int(size * fraction)
    if count:
        where = rng.choice(size, size=count, replace=False)
        moves = rng.integers(0, info.max, size=count, dtype=word, endpoint=True)
        small = rng.random(count) < 0.8
        moves[small] = rng.choice(np.array([1, info.max], dtype=word), size=int(small.sum()))
        new[where] += moves
    chunk = draw(st.sampled_from([1, 7, 256, 1 << 20]))
    return old, new, chunk


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_pairs(), st.sampled_from(DELTA_CODECS))
def test_every_codec_rebuilds_the_exact_bits(
    pair: tuple[np.ndarray, np.ndarray, int], codec: CodecId
) -> None:
    old, new, chunk = pair
    encoded = encode_tensor(new, old, CodecOptions(chunk_elements=chunk, codecs=(codec,)))
    out = old.copy() if encoded.codec is not CodecId.RAW else np.zeros_like(old)
    decode_tensor(encoded.codec, encoded.payload, out, changed=encoded.changed)
    assert np.array_equal(out, new)
    if np.array_equal(old, new):
        assert encoded.codec is CodecId.UNCHANGED and encoded.payload == b""


@settings(max_examples=80, deadline=None)
@given(tensor_pairs())
def test_the_choice_is_the_smallest_candidate(pair: tuple[np.ndarray, np.ndarray, int]) -> None:
    old, new, chunk = pair
    chosen = encode_tensor(new, old, CodecOptions(chunk_elements=chunk))
    for codec in DELTA_CODECS:
        alone = encode_tensor(new, old, CodecOptions(chunk_elements=chunk, codecs=(codec,)))
        if alone.codec is codec:
            assert len(chosen.payload) <= len(alone.payload) or codec in (
                CodecId.DENSE_SUB,
                CodecId.DENSE_XOR,
                CodecId.RAW,
            )


def test_zigzag_maps_one_ulp_moves_to_one_and_two() -> None:
    old = np.array([0x3F80, 0x3F80, 0xBF80, 0x0000], dtype=np.uint16)
    new = np.array([0x3F81, 0x3F7F, 0xBF81, 0xFFFF], dtype=np.uint16)
    zig = zigzag_diff(new, old)
    assert zig.tolist() == [2, 1, 2, 1]
    assert np.array_equal((old + unzigzag(zig)).astype(np.uint16), new)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    width=st.sampled_from([1, 2, 4, 8]),
    position_dtype=st.sampled_from([np.uint32, np.int64]),
    n=st.integers(1, 2000),
    seed=st.integers(0, 10_000),
)
def test_applying_changes_natively_matches_numpy_and_returns_the_undo(
    width: int, position_dtype: type, n: int, seed: int
) -> None:
    """The native scatter (``_context.apply_changes``) and numpy's gather/add/scatter
    write the same words, wrapping at the word's width, and both return what was there."""
    rng = np.random.default_rng(seed)
    word = np.dtype(f"u{width}")
    old = rng.integers(0, 1 << min(63, 8 * width), n, dtype=np.uint64).astype(word)
    positions = np.sort(rng.choice(n, rng.integers(1, n + 1), replace=False)).astype(position_dtype)
    new = old.copy()
    new[positions] = rng.integers(0, 1 << min(63, 8 * width), len(positions), dtype=np.uint64)
    new[positions[:1]] = old[positions[:1]] - word.type(1)  # a wrap below zero
    zig = zigzag_diff(new[positions], old[positions])
    results = []
    for native in (False, True):
        out = old.copy()
        before = apply_changes(out, positions, zig.copy(), native=native)
        assert np.array_equal(out, new), native
        assert np.array_equal(before, old[positions]), native
        results.append(out)


@pytest.mark.parametrize("native", [False, True])
def test_a_change_outside_the_words_is_refused_before_any_write(native: bool) -> None:
    out = np.arange(10, dtype=np.uint16)
    positions = np.array([2, 3, 10], dtype=np.int64)
    with pytest.raises(ValueError, match="outside"):
        apply_changes(out, positions, np.array([2, 2, 2], dtype=np.uint16), native=native)
    if native:  # numpy's fancy assignment may have written before it refused
        assert np.array_equal(out, np.arange(10, dtype=np.uint16))


def test_new_tensor_without_previous_is_raw() -> None:
    new = np.arange(1000, dtype=np.uint16)
    encoded = encode_tensor(new, None)
    assert encoded.codec is CodecId.RAW and encoded.changed is None
    out = np.zeros_like(new)
    decode_tensor(encoded.codec, encoded.payload, out)
    assert np.array_equal(out, new)


@given(st.integers(0, 2**63 - 1))
def test_varints_round_trip(value: int) -> None:
    data = bytearray()
    write_varint(value, data)
    assert Reader(memoryview(bytes(data))).varint(limit=2**63, field="x") == value


@pytest.mark.parametrize("data", [b"", b"\x80", b"\x80\x00", b"\xff" * 10])
def test_malformed_varints_fail_typed(data: bytes) -> None:
    with pytest.raises(DecodeFailed):
        Reader(memoryview(data)).varint(limit=2**63, field="x")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([CodecId.SPARSE, CodecId.DENSE_SUB, CodecId.DENSE_XOR, CodecId.RAW]),
    st.sampled_from(WORDS),
    st.integers(0, 600),
    st.binary(max_size=400),
)
def test_random_payloads_fail_typed_or_decode_in_bounds(
    codec: CodecId, word: type[np.unsignedinteger], size: int, payload: bytes
) -> None:
    """Arbitrary bytes as a payload: a typed error, never another exception or overrun."""
    out = np.zeros(size + 16, dtype=word)
    guard = out[size:].copy()
    with contextlib.suppress(DecodeFailed):
        decode_tensor(codec, payload, out[:size])
    assert np.array_equal(out[size:], guard)


@settings(max_examples=200, deadline=None)
@given(tensor_pairs(), st.data())
def test_mutated_payloads_fail_typed(
    pair: tuple[np.ndarray, np.ndarray, int], data: st.DataObject
) -> None:
    """Truncations, flips and insertions in a real payload: typed errors only."""
    old, new, chunk = pair
    encoded = encode_tensor(new, old, CodecOptions(chunk_elements=chunk))
    if not encoded.payload:
        return
    payload = bytearray(encoded.payload)
    action = data.draw(st.sampled_from(["truncate", "flip", "insert"]))
    at = data.draw(st.integers(0, len(payload) - 1))
    if action == "truncate":
        payload = payload[:at]
    elif action == "flip":
        payload[at] ^= 1 << data.draw(st.integers(0, 7))
    else:
        payload[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    out = old.copy()
    try:
        decode_tensor(encoded.codec, bytes(payload), out, changed=encoded.changed)
    except DecodeFailed:
        return
    # A mutation zstd cannot notice may decode to other bits: the tensor hash catches it.
    assert out.shape == new.shape
