"""The ``context`` codec: bit-exact, identical in its native and Python kernels, strict.

The native kernels (``_context.c``) and the Python reference must write the same bytes
and accept exactly the same streams: the reference is the specification in code, and
the fallback where the extension is not built. The native decode has two loops (AVX2
where the CPU has it, the portable one elsewhere): both run here on every stream, with
the same errors word for word.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotload.errors import DecodeFailed
from hotload.snapshot import CodecId, CodecOptions
from hotload.snapshot.codec import context, context_kernels
from hotload.snapshot.codec.context_model import ContextModel
from hotload.snapshot.codec.tensor_codec import decode_tensor, encode_tensor, plan_decode
from hotload.snapshot.codec.transforms import zigzag_diff
from hotload.snapshot.codec.varint import write_varint

DTYPES = {1: "F8_E4M3", 2: "BF16", 4: "F32", 8: "F64"}
BACKENDS = [False, *([True] if context_kernels.NATIVE else [])]
#: (native, simd) encoders: the reference, the native portable scan, the native AVX2 scan.
ENCODERS = [
    (False, False),
    *([(True, False)] if context_kernels.NATIVE else []),
    *([(True, True)] if context_kernels.SIMD else []),
]
#: (native, simd) decoders: the reference, the native portable loop, the native AVX2 loop.
DECODERS = [
    (False, False),
    *([(True, False)] if context_kernels.NATIVE else []),
    *([(True, True)] if context_kernels.SIMD else []),
]


def step_like(n: int, width: int, seed: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Previous and next words where small exponents move more often, as in an RL step."""
    rng = np.random.default_rng(seed)
    word = np.dtype(f"u{width}")
    old = rng.integers(0, 1 << min(63, 8 * width), n, dtype=np.uint64).astype(word)
    if width == 2:  # bf16 around N(0, 0.02): exponents 110..124
        old = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(word)
    new = old.copy()
    moved = rng.random(n) < fraction * (1 + (np.arange(n) % 3))
    steps = rng.choice(np.array([1, -1, 1, -1, 2, -3], dtype=np.int64), n)
    if width == 8:
        new[moved] = (old[moved].view(np.int64) + steps[moved]).view(word)
    else:
        new[moved] = (old[moved].astype(np.int64) + steps[moved]).astype(word)
    return old, new


def encode_with(
    native: bool,
    old: np.ndarray,
    new: np.ndarray,
    chunk: int,
    classes: int,
    dtype: str,
    simd: bool = True,
) -> bytes:
    positions = np.flatnonzero(new != old)
    inputs = context.ContextInputs(old, positions, zigzag_diff(new[positions], old[positions]))
    original = context_kernels.encode_chunk
    try:
        context_kernels.encode_chunk = (  # type: ignore[assignment]
            lambda *args, **kwargs: original(*args, **kwargs, native=native, simd=simd)
        )
        return context.encode(inputs, chunk, dtype=dtype, classes=classes)
    finally:
        context_kernels.encode_chunk = original  # type: ignore[assignment]


def decode_with(
    decoder: tuple[bool, bool], payload: bytes, old: np.ndarray, changed: int | None
) -> np.ndarray:
    native, simd = decoder
    out = old.copy()
    original = context_kernels.decode_chunk
    try:
        context_kernels.decode_chunk = (  # type: ignore[assignment]
            lambda *args, **kwargs: original(*args, **kwargs, native=native, simd=simd)
        )
        decode_tensor(CodecId.CONTEXT, payload, out, tensor="t", changed=changed)
    finally:
        context_kernels.decode_chunk = original  # type: ignore[assignment]
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    width=st.sampled_from([1, 2, 4, 8]),
    n=st.integers(1, 3000),
    chunk=st.integers(1, 4000),
    classes=st.sampled_from([1, 2, 3, 8]),
    fraction=st.sampled_from([0.0, 0.002, 0.05, 0.3]),
    seed=st.integers(0, 1000),
)
def test_round_trip_is_bit_exact_and_the_kernels_agree(
    width: int, n: int, chunk: int, classes: int, fraction: float, seed: int
) -> None:
    old, new = step_like(n, width, seed, fraction)
    payloads = {
        (native, simd): encode_with(native, old, new, chunk, classes, DTYPES[width], simd)
        for native, simd in ENCODERS
    }
    assert len(set(payloads.values())) == 1, "native and Python kernels wrote different bytes"
    payload = payloads[(False, False)]
    changed = int(np.count_nonzero(new != old))
    for decoder in DECODERS:
        assert np.array_equal(decode_with(decoder, payload, old, changed), new), decoder


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("classes", [1, 8])
@pytest.mark.parametrize("n", [64 * 1000 + 37, 200_003])
def test_long_sparse_chunks_decode_alike(width: int, classes: int, n: int) -> None:
    """Gaps spanning thousands of 64-element blocks, changes at a chunk's first and last
    elements, and tails shorter than a block: the loops that count 64 at a time agree
    (the decoders, and the encoders' rank scans)."""
    old, new = step_like(n, width, n + width, 0.00005)
    for at in (0, 1, 63, 64, n - 65, n - 1):
        new[at] = old[at] ^ 1
    payload = encode_with(False, old, new, n, classes, DTYPES[width])
    for native, simd in ENCODERS:
        assert encode_with(native, old, new, n, classes, DTYPES[width], simd) == payload
    changed = int(np.count_nonzero(new != old))
    for decoder in DECODERS:
        assert np.array_equal(decode_with(decoder, payload, old, changed), new), decoder


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 50))
def test_corrupted_streams_are_refused_alike(data: st.DataObject, seed: int) -> None:
    """A flipped, cut or extended stream is DecodeFailed, or decodes to the same words in
    both kernels (the rebuilt tensor's hash then refuses it)."""
    old, new = step_like(700, 2, seed, 0.03)
    payload = bytearray(encode_with(False, old, new, 256, 8, "BF16"))
    action = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if action == "flip":
        bit = data.draw(st.integers(0, 8 * len(payload) - 1))
        payload[bit // 8] ^= 1 << (bit % 8)
    elif action == "cut":
        del payload[data.draw(st.integers(0, len(payload) - 1)) :]
    else:
        payload += bytes(data.draw(st.binary(min_size=1, max_size=4)))
    outcomes: dict[tuple[bool, bool], bytes | str] = {}
    for decoder in DECODERS:
        try:
            outcomes[decoder] = decode_with(decoder, bytes(payload), old, None).tobytes()
        except DecodeFailed as err:
            outcomes[decoder] = str(err) if decoder[0] else "refused"
    refused = {d: isinstance(o, str) for d, o in outcomes.items()}
    assert len(set(refused.values())) == 1, outcomes
    # The two native loops agree word for word, errors included.
    native = {o for d, o in outcomes.items() if d[0]}
    assert len(native) <= 1, outcomes


def model_payload(model_bytes: bytes, numel: int = 10) -> bytes:
    head = bytearray()
    write_varint(numel, head)
    return bytes(head) + model_bytes + b"\x00"  # one chunk, no changes


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        (bytes([7, 8, 0, 0]), "classes"),  # zero classes
        (bytes([7, 8, 0, 9]), "classes"),  # nine classes
        (bytes([12, 8, 0, 1, 1, 255]), "key"),  # key past a 16-bit word
        (bytes([7, 13, 0, 1, 1, 255]), "key"),  # key wider than 12 bits
        (bytes([7, 8, 0, 1, 0, 255]), "Golomb"),  # Golomb parameter 0
        (bytes([7, 8, 0, 1, 1, 63]), "order"),  # value order past 62
        (bytes([7, 8, 0x81, 0x04, 1, 1, 255]), "limit"),  # lo past 2**key_bits
    ],
)
def test_malformed_models_are_refused_before_decoding(model: bytes, problem: str) -> None:
    with pytest.raises(DecodeFailed):
        plan_decode(CodecId.CONTEXT, memoryview(model_payload(model)), 10, 2, tensor="t")


def test_declared_changes_must_match_the_manifest() -> None:
    old, new = step_like(500, 2, 3, 0.05)
    payload = encode_with(False, old, new, 128, 8, "BF16")
    changed = int(np.count_nonzero(new != old))
    with pytest.raises(DecodeFailed):
        plan_decode(CodecId.CONTEXT, memoryview(payload), 500, 2, tensor="t", changed=changed + 1)


@pytest.mark.parametrize("native", BACKENDS)
def test_a_stream_claiming_fewer_or_more_changes_is_refused(native: bool) -> None:
    old, new = step_like(400, 2, 5, 0.05)
    model = ContextModel(7, 8, 118, (20,) * 8, (0,) * 8)
    positions = np.flatnonzero(new != old)
    values = zigzag_diff(new[positions], old[positions])
    stream = context_kernels.encode_chunk(old, model, positions, values, native=native)
    for wrong in (len(positions) - 1, len(positions) + 1):
        with pytest.raises(DecodeFailed):
            context_kernels.decode_chunk(old, model, stream, wrong, what="t", native=native)


def test_context_beats_order_zero_where_exponents_predict_changes() -> None:
    """bf16 weights whose small magnitudes move more: the encoder keeps classes."""
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.02, 200_000).astype(np.float32)
    old = (weights.view(np.uint32) >> 16).astype(np.uint16)
    exponent = (old >> 7) & 0xFF
    moves = rng.random(len(old)) < np.clip(2.0 ** (110 - exponent.astype(np.float64)), 0, 0.5)
    new = old.copy()
    new[moves] += 1
    with_context = encode_tensor(new, old, CodecOptions(codecs=(CodecId.CONTEXT,)), dtype="BF16")
    order0 = encode_tensor(
        new, old, CodecOptions(codecs=(CodecId.CONTEXT,), context_classes=1), dtype="BF16"
    )
    assert with_context.codec is CodecId.CONTEXT
    assert len(with_context.payload) < 0.9 * len(order0.payload)
    out = old.copy()
    decode_tensor(CodecId.CONTEXT, with_context.payload, out, changed=with_context.changed)
    assert np.array_equal(out, new)


def test_chunks_without_changes_store_no_stream() -> None:
    old = np.arange(4096, dtype=np.uint16)
    new = old.copy()
    new[5] += 1
    payload = encode_with(False, old, new, 1024, 1, "BF16")
    chunks = context.parse(memoryview(payload), 4096, 2, tensor="t")
    assert [c.changes for c in chunks] == [1, 0, 0, 0]
    assert [len(c.stream) for c in chunks][1:] == [0, 0, 0]


def test_native_kernels_are_built_where_the_package_is_installed() -> None:
    """CI installs the package (pip compiles ``_context.c``): there the fast path must be
    in use, or every context-coded tensor would decode at Python speed unnoticed."""
    if os.environ.get("CI"):
        assert context_kernels.NATIVE
        if _cpu_has("avx2", "bmi2", "popcnt"):
            assert context_kernels.SIMD, "the AVX2 decode is not in use on an AVX2 CPU"


def _cpu_has(*flags: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            line = next((raw for raw in cpuinfo if raw.startswith("flags")), "")
    except OSError:
        return False
    return set(flags) <= set(line.split())
