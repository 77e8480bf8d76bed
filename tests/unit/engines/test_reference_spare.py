"""Deltas in a row through the spare parameters stay bit-exact, in process.

The reference runtime keeps the float32 parameters of the step before as a spare and
brings it forward with only the elements the last two deltas wrote. These tests drive
the real runtime (tiny model) through real deltas from the encoder and compare every
float32 parameter with the exact widening of the step's bf16 weights file after each
patch — a spare that missed an element, or that aliased the served tensors, fails them.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hotload.api import SnapshotKind
from hotload.engines.reference import _spare
from hotload.engines.reference import model as rm
from hotload.engines.reference import spare as spare_module
from hotload.engines.reference.runtime import ReferenceRuntime
from hotload.engines.reference.spare import SpareParameters, WrittenElements
from hotload.errors import EngineRejected
from hotload.snapshot import encode, manifest_digest, read_manifest
from tests.unit.snapshot import tampering


def next_step(previous: Path, target: Path, *, seed: int, fraction: float = 0.01) -> Path:
    """The next snapshot: ``fraction`` of every tensor's bf16 elements moved by ±1 unit."""
    shutil.copytree(previous, target)
    tensors = load_file(str(previous / rm.WEIGHTS_FILE))
    generator = torch.Generator().manual_seed(seed)
    moved = {}
    for name, tensor in tensors.items():
        words = tensor.contiguous().view(torch.int16).clone().reshape(-1)
        where = torch.rand(words.numel(), generator=generator) < fraction
        signs = torch.randint(0, 2, (words.numel(),), generator=generator, dtype=torch.int16)
        words[where] += (signs * 2 - 1)[where]
        moved[name] = words.view(torch.bfloat16).reshape(tensor.shape)
    save_file(moved, str(target / rm.WEIGHTS_FILE), metadata={"format": "pt"})
    return target


def assert_serves(runtime: ReferenceRuntime, weights: Path) -> None:
    """Every float32 parameter is the exact widening of the weights file's bf16 tensor."""
    expected = load_file(str(weights / rm.WEIGHTS_FILE))
    served = rm.parameters(runtime._base)
    for name, tensor in served.items():
        want = expected[name].to(torch.float32).view(torch.int32)
        assert torch.equal(tensor.detach().view(torch.int32), want), name


class Chain:
    """A full snapshot's weights and deltas after it, made by the real encoder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        config = rm.build_config("tiny")
        self.config = config
        self.weights = [rm.save_snapshot(rm.build_model(config, seed=5), root / "w0")]

    def delta(self, *, fraction: float = 0.01) -> tuple[Path, str]:
        step = len(self.weights)
        current = next_step(self.weights[-1], self.root / f"w{step}", seed=step, fraction=fraction)
        out = self.root / f"d{step}"
        encode(
            self.weights[-1],
            current,
            out,
            identity=f"s-{step}",
            step=step,
            previous_identity=f"s-{step - 1}",
        )
        self.weights.append(current)
        return out, f"s-{step}"


@pytest.fixture
async def serving(tmp_path: Path) -> tuple[ReferenceRuntime, Chain]:
    chain = Chain(tmp_path)
    runtime = ReferenceRuntime(chain.config)
    await runtime.load(chain.weights[0], "s-0", SnapshotKind.FULL)
    return runtime, chain


async def test_deltas_in_a_row_are_bit_exact_through_the_spare(
    serving: tuple[ReferenceRuntime, Chain],
) -> None:
    runtime, chain = serving
    assert runtime._spare.held == 0
    for _ in range(4):
        path, identity = chain.delta()
        await runtime.apply_delta(path, identity)
        assert_serves(runtime, chain.weights[-1])
        assert await runtime.tensor_digest() == manifest_digest(read_manifest(path))
        # the spare is the step before, in separate memory from what serves
        assert runtime._spare.held == len(rm.parameters(runtime._base))
        served = {t.data_ptr() for t in rm.parameters(runtime._base).values()}
        assert not served & {t.data_ptr() for t in runtime._spare._tensors.values()}
    assert runtime.deltas_applied == 4


async def test_a_refused_delta_leaves_the_next_ones_exact(
    serving: tuple[ReferenceRuntime, Chain],
) -> None:
    """A patch that fails its tensor check after writing (re-signed corruption) is undone
    and leaves no spare (part of it may have been brought forward): the old weights
    serve on, and the next good deltas are exact."""
    runtime, chain = serving
    path, identity = chain.delta()
    await runtime.apply_delta(path, identity)
    good, good_identity = chain.delta()
    corrupt = good.with_name("corrupt")
    shutil.copytree(good, corrupt)
    blob = next(corrupt.glob("hotload-delta-*.bin"))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x10
    blob.write_bytes(bytes(data))
    tampering.resign(corrupt)
    with pytest.raises(EngineRejected):
        await runtime.apply_delta(corrupt, good_identity)
    assert_serves(runtime, chain.weights[-2])
    assert runtime._spare.held == 0
    await runtime.apply_delta(good, good_identity)
    assert_serves(runtime, chain.weights[-1])
    path, identity = chain.delta()
    await runtime.apply_delta(path, identity)
    assert_serves(runtime, chain.weights[-1])


async def test_dense_deltas_rewrite_the_spare_whole_and_stay_exact(
    serving: tuple[ReferenceRuntime, Chain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deltas touching more than WHOLE_FRACTION of the elements take the whole-tensor
    path of the catch-up; fewer take the element path (the other tests): both exact."""
    runtime, chain = serving
    whole: list[str] = []
    original = spare_module._widen_whole

    def spy(target: torch.Tensor, source: torch.Tensor) -> None:
        whole.append(str(source.shape))
        original(target, source)

    monkeypatch.setattr(spare_module, "_widen_whole", spy)
    for _ in range(3):
        path, identity = chain.delta(fraction=min(0.9, 1.5 * spare_module.WHOLE_FRACTION))
        await runtime.apply_delta(path, identity)
        assert_serves(runtime, chain.weights[-1])
    assert whole, "no tensor took the whole-tensor path"


def test_the_native_widening_writes_the_same_bits_as_numpy_and_checks_positions() -> None:
    """The C loop (``_spare.c``) and the numpy fallback widen the same bf16 bits to the
    same float32 bits at the same positions, specials included; a position outside the
    tensor is refused, never written."""
    if not spare_module.NATIVE:
        pytest.fail("the native spare kernel is not built (python setup.py build_ext --inplace)")
    rng = np.random.default_rng(7)
    words = rng.integers(0, 1 << 16, 5000, dtype=np.uint16)
    words[:4] = [0x7F80, 0xFF80, 0x7FC1, 0x8000]  # +inf, -inf, a NaN payload, -0
    source = torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)
    positions = np.sort(rng.choice(5000, 700, replace=False)).astype(np.int64)
    positions[:4] = [0, 1, 2, 3]
    outputs = []
    for native in (False, True):
        target = torch.zeros(5000, dtype=torch.float32)
        ranges = [
            spare_module.WrittenRange(4990, 10, None),
            spare_module.WrittenRange(0, 5000, positions),
        ]
        spare_module._copy_ranges(target, source, ranges, native=native)
        outputs.append(target.view(torch.int32).numpy().copy())
    assert np.array_equal(outputs[0], outputs[1])
    expected = np.zeros(5000, dtype=np.uint32)
    for index in [*positions, *range(4990, 5000)]:
        expected[index] = np.uint32(words[index]) << np.uint32(16)
    assert np.array_equal(outputs[1].view(np.uint32), expected)
    out = np.zeros(5000, dtype=np.uint32)
    for bad in (-1, 5000):
        with pytest.raises(ValueError, match="outside the tensor"):
            _spare.widen_bf16_at(out, words, np.array([bad], dtype=np.int64))
    with pytest.raises(ValueError, match="4 bytes per 2-byte word"):
        _spare.widen_bf16_at(out[:10], words, positions)
    assert not out.any()


async def test_a_directory_load_drops_the_spare(serving: tuple[ReferenceRuntime, Chain]) -> None:
    runtime, chain = serving
    for _ in range(2):
        path, identity = chain.delta()
        await runtime.apply_delta(path, identity)
    assert runtime._spare.held
    await runtime.load(chain.weights[-1], identity, SnapshotKind.FULL)
    assert runtime._spare.held == 0
    for _ in range(2):
        path, identity = chain.delta(fraction=0.05)
        await runtime.apply_delta(path, identity)
        assert_serves(runtime, chain.weights[-1])


@pytest.mark.parametrize("positions_dtype", [np.uint32, np.int64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_catch_up_writes_both_deltas_sparse_and_whole_ranges(
    dtype: torch.dtype, positions_dtype: type[np.integer[Any]]
) -> None:
    """The spare, two steps behind, takes the previous delta's ranges and this one's:
    positions (widened on the words for bf16, through torch otherwise) and whole ranges."""
    generator = torch.Generator().manual_seed(0)
    step0 = {"a": torch.randn(6, 500, generator=generator).to(dtype), "b": torch.randn(7).to(dtype)}
    held = {name: tensor.clone() for name, tensor in step0.items()}
    spare = SpareParameters()
    assert spare.catch_up(held, WrittenElements(), torch.float32)["a"].dtype == torch.float32

    def write(
        elements: WrittenElements, name: str, start: int, positions: list[int] | None
    ) -> None:
        flat = held[name].view(-1)
        length = 100 if positions is not None else 50
        where = (
            range(start, start + length) if positions is None else [start + p for p in positions]
        )
        for i in where:
            flat[i] = flat[i] + 1
        elements.heard(
            name,
            start,
            None if positions is None else np.array(positions, dtype=positions_dtype),
            length,
        )

    first = WrittenElements()
    write(first, "a", 0, [1, 5, 99])
    write(first, "a", 1000, None)
    spare.keep({n: t.to(torch.float32) for n, t in step0.items()}, first)
    second = WrittenElements()
    write(second, "a", 2000, [0, 3])
    write(second, "b", 0, [6])
    fresh = spare.catch_up(held, second, torch.float32)
    for name, tensor in held.items():
        assert torch.equal(fresh[name], tensor.to(torch.float32)), name
    assert spare.held == 0, "the spare is consumed until the swap hands it back"
    assert second.count() == 3 and first.count() == 53


async def _cancelled_midway(runtime: ReferenceRuntime, call: Any) -> None:
    """Start ``call``, cancel its caller while the engine waits between reading and
    swapping (``swap_delay_s``), then wait until the engine's load is over."""
    runtime.swap_delay_s = 0.3
    task = asyncio.ensure_future(call)
    while runtime.loading is None:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    runtime.swap_delay_s = 0.0
    deadline = asyncio.get_running_loop().time() + 30
    while runtime.loading is not None:
        assert asyncio.get_running_loop().time() < deadline, "the load never ended"
        await asyncio.sleep(0.01)


async def test_a_patch_whose_caller_is_cancelled_still_ends_whole(
    serving: tuple[ReferenceRuntime, Chain],
) -> None:
    """An in-process caller cancelled between the patch of the held bits and the swap:
    the engine finishes the delta (held bits, parameters, identity and digest agree) —
    it never serves old parameters while holding and naming other bits."""
    runtime, chain = serving
    path, identity = chain.delta()
    await _cancelled_midway(runtime, runtime.apply_delta(path, identity))
    assert runtime.identity == identity
    assert_serves(runtime, chain.weights[-1])
    assert await runtime.tensor_digest() == manifest_digest(read_manifest(path))
    # and the chain goes on by deltas from there
    path, identity = chain.delta()
    await runtime.apply_delta(path, identity)
    assert_serves(runtime, chain.weights[-1])


async def test_a_load_whose_caller_is_cancelled_still_ends_whole(
    serving: tuple[ReferenceRuntime, Chain],
) -> None:
    runtime, chain = serving
    chain.delta()
    await _cancelled_midway(runtime, runtime.load(chain.weights[-1], "s-1-full", SnapshotKind.FULL))
    assert runtime.identity == "s-1-full"
    assert_serves(runtime, chain.weights[-1])
