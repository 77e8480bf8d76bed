"""Every path of the tensor encoder writes the bytes it wrote before its native path.

The paths: the native one (one scan per chunk finds the changes, the context codec's
ranks, bits and magnitude orders in C) on its AVX2 loops where the CPU has them and on
its portable loops (``simd=False``), and the reference path (``native=False``: the
whole-tensor numpy passes torch words take). The oracles: the golden payloads
(tests/golden/encoder, written by the encoder of commit d2baf31) and that encoder frozen
(``encoder_reference``) on random tensors of every dtype and shape and on real Adam steps.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotload.snapshot import CodecId, CodecOptions
from hotload.snapshot.codec import changes, context, context_kernels, sparse
from hotload.snapshot.codec.context_model import (
    EXPONENT_KEYS,
    choose_model,
    fit_changes,
    value_orders,
)
from hotload.snapshot.codec.tensor_codec import encode_tensor

from . import encoder_reference

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "encoder"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("encoder_golden", GOLDEN / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


generate = _generator()
EXPECTED: dict[str, dict[str, Any]] = json.loads((GOLDEN / "expected.json").read_text())
PATHS: dict[str, dict[str, bool]] = {
    "reference path": {"native": False},
    **({"native, portable loops": {"simd": False}, "native": {}} if context_kernels.NATIVE else {}),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_writes_the_golden_payloads(path: str) -> None:
    encode = functools.partial(encode_tensor, **PATHS[path])
    found = {
        case.name: generate.summary(generate.run(case, encode, CodecOptions, CodecId))
        for case in generate.cases()
    }
    assert found.keys() == EXPECTED.keys()
    for name, summary in found.items():
        assert summary == EXPECTED[name], name


def test_chunks_encoded_on_threads_write_the_golden_payloads() -> None:
    with ThreadPoolExecutor(2) as pool:
        for case in generate.cases():
            if case.chunk < case.n <= 1000 * case.chunk:
                encode = functools.partial(encode_tensor, executor=pool)
                found = generate.summary(generate.run(case, encode, CodecOptions, CodecId))
                assert found == EXPECTED[case.name], case.name


def test_the_golden_payloads_cover_every_codec_and_edge() -> None:
    assert {s["codec"] for s in EXPECTED.values()} == {c.value for c in CodecId} - {
        "stored",
        "parts",
    }
    sizes = {case.n for case in generate.cases()}
    assert {0, 1, 63, 64, 65} <= sizes
    assert {case.dtype for case in generate.cases()} >= set(generate.WIDTHS)


@st.composite
def tensors(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, CodecOptions, str | None]:
    dtype = draw(st.sampled_from([*generate.WIDTHS, None]))
    width = generate.WIDTHS.get(dtype or "", draw(st.sampled_from([1, 2, 4, 8])))
    n = draw(st.one_of(st.sampled_from([0, 1, 2, 31, 32, 33, 64, 65]), st.integers(0, 5000)))
    case = generate.Case(
        "drawn",
        dtype,
        width,
        n,
        draw(st.integers(1, 10**6)),
        draw(st.sampled_from([0, 30, 2000, 10_000, 100_000, 300_000, 10**6])),
        draw(st.sampled_from(["ulp", "mixed", "random"])),
    )
    old, new = case.words()
    codecs = draw(
        st.sampled_from(
            [
                CodecOptions().codecs,
                (CodecId.CONTEXT,),
                (CodecId.SPARSE, CodecId.CONTEXT),
                (CodecId.DENSE_SUB, CodecId.RAW),
            ]
        )
    )
    options = CodecOptions(
        chunk_elements=draw(st.sampled_from([1, 5, 64, 1000, 1 << 20])),
        context_classes=draw(st.sampled_from([1, 2, 3, 8])),
        codecs=codecs,
    )
    return old, new, options, dtype


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(tensors())
def test_random_tensors_encode_as_the_frozen_encoder_did(
    drawn: tuple[np.ndarray, np.ndarray, CodecOptions, str | None],
) -> None:
    old, new, options, dtype = drawn
    expected = encoder_reference.reference_encode(new, old, options, dtype=dtype)
    for path, flags in PATHS.items():
        assert encode_tensor(new, old, options, dtype=dtype, **flags) == expected, path


@pytest.fixture
def native_kernels() -> None:
    """The native kernels are part of the product (hack/bootstrap builds them; CI always
    has them): a test of them fails when they are missing rather than skipping."""
    assert context_kernels.NATIVE, (
        "the codec's native kernels are not built: python setup.py build_ext --inplace"
    )


def test_real_adam_steps_encode_as_the_frozen_encoder_did() -> None:
    """A small network trained for real (Adam at RL learning rates), its weights cast to
    bf16, f16 and f32 after every step: the changes an RL trainer publishes."""
    import torch

    torch.manual_seed(3)
    casts = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}

    def words(tensor: Any) -> np.ndarray:
        flat = tensor.detach().reshape(-1).contiguous()
        width = flat.element_size()
        signed = {2: torch.int16, 4: torch.int32}[width]
        host: np.ndarray = flat.view(signed).numpy().view(f"u{width}")
        return host

    options = CodecOptions(chunk_elements=1000)
    chosen: set[CodecId] = set()
    for lr in (1e-6, 1e-5):
        model = torch.nn.Sequential(
            torch.nn.Linear(24, 64),
            torch.nn.GELU(),
            torch.nn.LayerNorm(64),
            torch.nn.Linear(64, 12),
        )
        steps = [{n: p.detach().clone() for n, p in model.named_parameters()}]
        moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in steps[0].items()}
        for t in (1, 2):  # Adam (beta 0.9, 0.999), written out: torch.optim imports dynamo
            model.zero_grad()
            model(torch.randn(32, 24)).pow(2).mean().backward()
            with torch.no_grad():
                for n, p in model.named_parameters():
                    m, v = moments[n]
                    m.mul_(0.9).add_(p.grad, alpha=0.1)
                    v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                    step = (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8)
                    p.sub_(step, alpha=lr)
            steps.append({n: p.detach().clone() for n, p in model.named_parameters()})
        for before, after in itertools.pairwise(steps):
            for name in before:
                for dtype, cast in casts.items():
                    old, new = words(before[name].to(cast)), words(after[name].to(cast))
                    expected = encoder_reference.reference_encode(new, old, options, dtype=dtype)
                    chosen.add(expected.codec)
                    for path, flags in PATHS.items():
                        found = encode_tensor(new, old, options, dtype=dtype, **flags)
                        assert found == expected, (lr, name, dtype, path)
    assert CodecId.CONTEXT in chosen


@pytest.mark.usefixtures("native_kernels")
def test_torch_words_in_host_memory_take_the_native_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer's CPU state_dict is encoded by the native path (viewed, not copied); a
    named torch backend still runs the torch transforms. The same payload every way."""
    import torch

    from hotload.snapshot.codec.torch_words import TORCH_WORDS, words_of

    case = generate.Case("torch", "BF16", 2, 50_000, 9, 6500, "mixed", chunk=4096)
    old, new = case.words()
    as_torch = [words_of(torch.from_numpy(w.view(np.int16))) for w in (new, old)]
    scans: list[int] = []
    scan = changes.scan_tensor
    monkeypatch.setattr(changes, "scan_tensor", lambda *a, **k: scans.append(1) or scan(*a, **k))
    options = CodecOptions(chunk_elements=4096)
    expected = encode_tensor(new, old, options, dtype="BF16")
    assert encode_tensor(*as_torch, options, dtype="BF16") == expected
    assert len(scans) == 2  # numpy words, then the torch words' views
    assert encode_tensor(*as_torch, options, backend=TORCH_WORDS, dtype="BF16") == expected
    assert len(scans) == 2


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dtype=st.sampled_from(["F8_E5M2", "BF16", "F16", "U16", "F32", "F64"]),
    n=st.one_of(
        st.sampled_from([0, 1, 7, 31, 32, 33, 4095, 4096, 4097, 4096 + 255 * 32 + 1, 30_001]),
        st.integers(0, 9000),
    ),
    per_million=st.sampled_from([0, 100, 50_000, 10**6]),
    seed=st.integers(1, 10**6),
    keyed=st.booleans(),
    collect=st.booleans(),
)
def test_the_native_scan_finds_what_numpy_finds(
    dtype: str, n: int, per_million: int, seed: int, keyed: bool, collect: bool
) -> None:
    """Every width; for 2-byte words the AVX2 scan's edges: the first 4096 elements
    counted apart, 255-step sums, tails under 32, keys outside the window of 16 (U16:
    uniform words under bf16's key)."""
    old = generate.previous_words(dtype, n, seed)
    new = generate.stepped(old, seed + 1, per_million, "mixed")
    shift, bits = EXPONENT_KEYS.get(dtype, EXPONENT_KEYS["BF16"]) if keyed else (0, 0)
    scans = [(False, False), *([(True, False), (True, True)] if context_kernels.NATIVE else [])]
    found = [
        changes.scan_chunk(
            new,
            old,
            5,
            key_shift=shift,
            key_bits=bits,
            collect=collect,
            count_keys=keyed,
            native=native,
            simd=simd,
        )
        for native, simd in scans
    ]
    for other in found[1:]:
        assert (other.start, other.length, other.count, other.collected) == (
            found[0].start,
            found[0].length,
            found[0].count,
            found[0].collected,
        )
        assert np.array_equal(other.positions, found[0].positions)
        assert other.positions.dtype == np.uint32 and other.values.dtype == old.dtype
        assert np.array_equal(other.values, found[0].values)
        assert (other.key_counts is None) == (found[0].key_counts is None)
        if other.key_counts is not None and found[0].key_counts is not None:
            assert np.array_equal(other.key_counts, found[0].key_counts)
    assert found[0].count == int(np.count_nonzero(new != old))


@settings(max_examples=100, deadline=None)
@given(
    width=st.sampled_from([1, 2, 4, 8]),
    n=st.integers(1, 3000),
    spacing=st.sampled_from([1, 2, 200, 300, 70_000, 3_000_000]),
    seed=st.integers(0, 2**32 - 1),
)
def test_sparse_frames_from_native_planes_match_numpy_planes(
    width: int, n: int, spacing: int, seed: int
) -> None:
    """Gaps needing one, two and three planes, all-zero planes (empty frames), every width."""
    rng = np.random.default_rng(seed)
    positions = np.cumsum(rng.integers(1, spacing + 1, n))
    positions = positions[positions < 1 << 24].astype(np.uint32)
    values = rng.integers(1, 3, len(positions)).astype(f"u{width}")
    if seed % 3 == 0:
        values = (values.astype(np.uint64) << np.uint64(8 * width - 8)).astype(f"u{width}")
    assert sparse.compress_changes(positions, values, 3, native=True) == sparse.compress_changes(
        positions, values, 3, native=False
    )


@pytest.mark.usefixtures("native_kernels")
def test_the_native_scan_refuses_buffers_that_disagree() -> None:
    from hotload.snapshot.codec import _context

    words = np.zeros(10, dtype=np.uint16)
    empty = np.zeros(0, dtype=np.uint8)
    with pytest.raises(ValueError, match="disagree"):
        _context.scan_chunk(words, words[:9], 2, 0, 0, empty, empty, empty)
    with pytest.raises(ValueError, match="key outside"):
        _context.scan_chunk(words, words, 2, 10, 8, empty, empty, empty)
    with pytest.raises(ValueError, match="output buffers"):
        _context.scan_chunk(words, words, 2, 0, 0, np.zeros(9, np.uint32), empty, empty)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    classes=st.integers(1, 8),
    n=st.integers(0, 80),
    kind=st.sampled_from(["small", "geometric", "huge", "near powers", "wide"]),
)
def test_magnitude_orders_match_one_order_per_class(
    data: st.DataObject, classes: int, n: int, kind: str
) -> None:
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    magnitudes = {
        "small": lambda: rng.integers(0, 3, n).astype(np.uint64),
        "geometric": lambda: rng.geometric(0.3, n).astype(np.uint64),
        "huge": lambda: rng.integers(0, 1 << 63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1),
        "near powers": lambda: (
            (np.uint64(1) << rng.integers(30, 64, n).astype(np.uint64))
            - rng.integers(0, 3, n).astype(np.uint64)
        ),
        "wide": lambda: rng.integers(1, 40_000, n).astype(np.uint64),
    }[kind]()
    change_class = rng.integers(0, classes, n)
    expected = tuple(
        encoder_reference.value_order(magnitudes[change_class == c]) for c in range(classes)
    )
    for native in (False, True):
        assert value_orders(magnitudes, change_class, classes, native=native) == expected


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    key_bits=st.sampled_from([4, 5, 8, 11]),
    spread=st.integers(1, 40),
    classes=st.sampled_from([1, 2, 3, 8]),
    changes_count=st.integers(0, 3000),
)
def test_the_model_fit_matches_the_frozen_fit(
    seed: int, key_bits: int, spread: int, classes: int, changes_count: int
) -> None:
    """Key counts with empty keys and equal costs, where a different rounding would pick
    another ``lo``."""
    rng = np.random.default_rng(seed)
    size = 1 << key_bits
    centre = int(rng.integers(0, size))
    keys = np.clip(centre + rng.integers(-spread, spread + 1, 50_000), 0, size - 1)
    per_key = np.bincount(keys, minlength=size).astype(np.int64)
    changed_keys = rng.choice(keys, changes_count).astype(np.uint16)
    magnitudes = rng.geometric(0.7, changes_count).astype(np.uint64)
    arguments: dict[str, Any] = {"key_shift": 3, "key_bits": key_bits, "classes": classes}
    expected = encoder_reference.choose_model(
        per_key, len(keys), changed_keys, magnitudes, **arguments
    )
    for native in (False, True):
        found = choose_model(
            per_key, len(keys), changed_keys, magnitudes, **arguments, native=native
        )
        assert found == expected, native


@pytest.mark.usefixtures("native_kernels")
@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    width=st.sampled_from([1, 2, 4, 8]),
    key_bits=st.sampled_from([0, 1, 4, 5, 8, 11]),
    spread=st.integers(1, 40),
    classes=st.sampled_from([1, 2, 3, 8]),
    chunks=st.lists(st.integers(0, 700), min_size=1, max_size=5),
    kind=st.sampled_from(["ulp", "geometric", "wide", "huge"]),
)
def test_the_native_fit_from_the_chunks_matches_the_fit_from_arrays(
    seed: int,
    width: int,
    key_bits: int,
    spread: int,
    classes: int,
    chunks: list[int],
    kind: str,
) -> None:
    """``fit_changes`` (what the scan found per chunk, fitted in C) against ``choose_model``
    on the concatenated arrays: the same model, or None where a magnitude is too large for
    exact lengths (8-byte words' largest), when the caller fits with choose_model."""
    rng = np.random.default_rng(seed)
    word = np.dtype(f"u{width}")
    size = 1 << key_bits
    elements = 60_000
    centre = int(rng.integers(0, size))
    keys = np.clip(centre + rng.integers(-spread, spread + 1, elements), 0, size - 1)
    per_key = np.bincount(keys, minlength=size).astype(np.int64) if key_bits else None
    top = min(int(np.iinfo(word).max), 1 << 62)
    values = [
        {
            "ulp": lambda n: rng.integers(1, 3, n),
            "geometric": lambda n: np.minimum(rng.geometric(0.3, n), top),
            "wide": lambda n: rng.integers(1, min(top, 40_000) + 1, n),
            "huge": lambda n: rng.integers(1, np.iinfo(word).max, n, dtype=word, endpoint=True),
        }[kind](n).astype(word)
        for n in chunks
    ]
    changed_keys = [rng.choice(keys, len(v)).astype(np.uint16) for v in values]
    arguments: dict[str, Any] = {"key_shift": 2, "key_bits": key_bits, "classes": classes}
    kept = [i for i, v in enumerate(values) if len(v)]
    found = fit_changes(
        [values[i] for i in kept],
        [changed_keys[i] for i in kept],
        per_key,
        elements,
        **arguments,
    )
    magnitudes = changes.magnitudes_of(np.concatenate(values))
    expected = choose_model(
        per_key, elements, np.concatenate(changed_keys), magnitudes, **arguments
    )
    if not kept:
        assert found is None
    elif found is None:
        assert width == 8 and int(magnitudes.max()) > 1 << 40
    else:
        assert found == expected


@pytest.mark.usefixtures("native_kernels")
def test_the_native_fit_refuses_arguments_that_disagree() -> None:
    from hotload.snapshot.codec import _context

    per_key = np.ones(16, dtype=np.int64)
    keys = [np.array([3, 4], dtype=np.uint16)]
    values = [np.array([2, 5], dtype=np.uint16)]
    with pytest.raises(ValueError, match="disagree"):
        _context.fit_prepare([np.array([16], dtype=np.uint16)], per_key, 8)  # a key past 16
    with pytest.raises(ValueError, match="disagree"):
        _context.fit_prepare(keys, per_key[:12], 8)  # not a power of two
    with pytest.raises(ValueError, match="disagree"):
        _context.fit_prepare(keys, per_key, 9)
    with pytest.raises(ValueError, match="whole number"):
        _context.fit_prepare([np.zeros(3, dtype=np.uint8)], per_key, 8)
    changed, first, count, rows = _context.fit_prepare(keys, per_key, 8)
    logs = np.log2(np.frombuffer(rows, dtype=np.float64).reshape(4, -1)[1:3])
    window = (rows, logs, per_key, changed, first, count, 8)
    assert _context.fit_finish(values, 2, keys, 16, window) is not None
    with pytest.raises(ValueError, match="words out of range"):
        _context.fit_finish(values, 3, keys, 16, window)
    with pytest.raises(ValueError, match="disagree"):  # a chunk's keys and values
        _context.fit_finish(values, 2, [keys[0][:1]], 16, window)
    with pytest.raises(ValueError, match="disagree"):
        _context.fit_finish(values, 2, [np.array([3, 99], dtype=np.uint16)], 16, window)
    with pytest.raises(ValueError, match="disagree"):
        _context.fit_finish(values, 2, keys, 16, (rows, logs[:1], *window[2:]))
    with pytest.raises(ValueError, match="a tuple or None"):
        _context.fit_finish(values, 2, keys, 16, [rows])
    with pytest.raises(TypeError):
        _context.fit_finish(values, 2, [None], 16, window)


@pytest.mark.usefixtures("native_kernels")
@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    width=st.sampled_from([1, 2, 4, 8]),
    shape=st.tuples(st.integers(1, 20_000), st.sampled_from([1, 7, 64, 1000, 4096, 1 << 20])),
    moves=st.tuples(
        st.sampled_from([1, 300, 20_000, 200_000]), st.sampled_from([2, 50, 1 << 20, 1 << 62])
    ),
)
def test_the_order0_length_is_the_order0_payloads_length(
    seed: int, width: int, shape: tuple[int, int], moves: tuple[int, int]
) -> None:
    """The encoder writes the order-0 payload only when its counted length is not above
    the context one's: the count must be the written length exactly (Golomb parameters
    1 and above, gaps past 2^16, magnitudes of every size and unit-only classes)."""
    (n, chunk), (per_million, step) = shape, moves
    rng = np.random.default_rng(seed)
    word = np.dtype(f"u{width}")
    old = rng.integers(0, np.iinfo(word).max, n, dtype=word, endpoint=True)
    new = old.copy()
    moved = rng.choice(n, max(1, n * per_million // 10**6), replace=False)
    new[moved] += rng.integers(1, min(step, 1 << (8 * width - 1)), len(moved)).astype(word)
    bounds = [(s, min(chunk, n - s)) for s in range(0, n, chunk)]
    found = changes.scan_tensor(
        new, old, bounds, key_shift=0, key_bits=0, count_keys=False, limit=n
    )
    sized = context.order0_length(old, found, chunk)
    assert sized is not None
    payload = context.encode_changes(old, found, chunk, dtype=None, classes=1)
    assert sized[0] == len(payload)
    assert context.encode_changes(old, found, chunk, dtype=None, classes=1, model=sized[1]) == (
        payload
    )


@pytest.mark.usefixtures("native_kernels")
def test_the_order0_lengths_refuse_what_the_stream_writer_refuses() -> None:
    from hotload.snapshot.codec import _context

    positions = [np.array([0, 5], dtype=np.uint32)]
    lengths = np.array([9], dtype=np.uint64)
    two = [np.array([1, 2], dtype=np.uint16)]
    assert _context.stream_lengths(positions, two, lengths, 2, 3, 0) is not None
    # a zero difference, a unit class's larger change: the writer refuses them
    assert (
        _context.stream_lengths(positions, [np.array([0, 2], np.uint16)], lengths, 2, 3, 0) is None
    )
    assert (
        _context.stream_lengths(positions, [np.array([1, 4], np.uint16)], lengths, 2, 3, 255)
        is None
    )
    for bad in (
        ([np.array([5, 0], dtype=np.uint32)], two, lengths),  # not increasing
        ([np.array([0, 9], dtype=np.uint32)], two, lengths),  # past the chunk
        (positions, [two[0][:1]], lengths),
        (positions, two, np.array([9, 9], dtype=np.uint64)),
        ([positions[0][:0]], [two[0][:0]], lengths),  # a chunk without a change
    ):
        with pytest.raises(ValueError, match="disagree"):
            _context.stream_lengths(*bad, 2, 3, 0)
    with pytest.raises(ValueError, match="out of range"):
        _context.stream_lengths(positions, two, lengths, 2, 0, 0)
    with pytest.raises(ValueError, match="out of range"):
        _context.stream_lengths(positions, two, lengths, 2, 3, 63)


STALE = """
import importlib, sys, types
import numpy as np
real = importlib.import_module("hotload.snapshot.codec._context")
stale = types.ModuleType(real.__name__)
for name in ("decode_chunk", "encode_chunk", "apply_changes", "SIMD"):  # before the encoder's
    setattr(stale, name, getattr(real, name))
sys.modules[real.__name__] = stale
import hotload.snapshot.codec as package
package._context = stale
from hotload.snapshot.codec import context_kernels
from hotload.snapshot.codec.tensor_codec import encode_tensor
old = np.arange(5000, dtype=np.uint16)
new = old.copy()
new[::97] += 1
print(context_kernels.NATIVE, encode_tensor(new, old, dtype="BF16").payload.hex())
"""


@pytest.mark.usefixtures("native_kernels")
def test_a_module_built_from_an_older_source_is_left_unused() -> None:
    """A work tree rebased past a change of _context.c runs at Python speed, same bytes,
    until it rebuilds: never a call into a module that lacks the entry point."""
    done = subprocess.run(
        [sys.executable, "-c", STALE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    old = np.arange(5000, dtype=np.uint16)
    new = old.copy()
    new[::97] += 1
    assert done.stdout.split() == ["False", encode_tensor(new, old, dtype="BF16").payload.hex()]
    assert "older source" in done.stderr
