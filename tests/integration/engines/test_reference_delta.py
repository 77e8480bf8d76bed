"""The reference engine patches a verified delta into its live weights, in place.

A real engine process, real snapshots and deltas from the encoder, driven through the
``ReferenceEngine`` adapter as the sidecar drives it: the patched weights are the next
snapshot's bit for bit; a delta that fails any check (a stored file's hash, a patched
tensor's hash, the chain) leaves the old weights serving and says why; a delta that
changes the layout asks for the rebuilt directory instead.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import ReferenceEngine
from hotload.engines.capabilities import patches_in_place, swaps_between_tokens
from hotload.errors import DeltaNotApplicable, EngineRejected
from hotload.snapshot import encode, manifest_digest, read_manifest
from hotload.waiting import wait_until_async
from tests.integration.engines.conftest import EngineProcess
from tests.integration.engines.test_reference_engine import (
    Publish,
    admin,
    complete,
    expected_digests,
    served_digests,
)
from tests.unit.snapshot import tampering


@pytest.fixture
async def engine(reference_engine: EngineProcess) -> AsyncIterator[ReferenceEngine]:
    adapter = ReferenceEngine(reference_engine.base_url)
    await adapter.wait_ready(timeout=30)
    try:
        yield adapter
    finally:
        await adapter.resume()
        await adapter.aclose()


def rl_step(
    previous: Path, target: Path, *, seed: int, extra: dict[str, torch.Tensor] | None = None
) -> Path:
    """The next snapshot: 1% of every tensor's bf16 elements moved by one unit."""
    shutil.copytree(previous, target)
    tensors = load_file(str(previous / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    moved = {}
    for name, tensor in tensors.items():
        words = tensor.contiguous().view(torch.int16).clone().reshape(-1)
        where = torch.rand(words.numel(), generator=generator) < 0.01
        words[where] += 1
        moved[name] = words.view(torch.bfloat16).reshape(tensor.shape)
    moved.update(extra or {})
    save_file(moved, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


async def serving_full(engine: ReferenceEngine, publish: Publish, identity: str) -> Path:
    directory = publish(identity, 11)
    await engine.load_weights(directory, identity, kind=SnapshotKind.FULL)
    return directory


def delta_of(previous: Path, current: Path, out: Path, identity: str, previous_id: str) -> Path:
    encode(previous, current, out, identity=identity, step=2, previous_identity=previous_id)
    return out


async def test_a_delta_is_patched_in_place_bit_exact(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    full = await serving_full(engine, publish, "dp-1")
    current = rl_step(full, engine_workdir / "dp-2-weights", seed=1)
    delta = delta_of(full, current, engine_workdir / "dp-2", "dp-2", "dp-1")
    await engine.apply_delta(delta, "dp-2")
    identity, logits, weights = await served_digests(engine)
    assert identity == "dp-2"
    assert (logits, weights) == expected_digests(current)
    answer = await complete(engine, "hello")
    assert answer["hotload_identity"] == "dp-2"


async def test_deltas_in_a_row_stay_bit_exact(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    """From the second delta on, the engine brings the parameters of the step before
    forward with only the elements the last two deltas wrote (docs/engines.md): every
    step's logits and weights are still the trainer's, a directory load in between
    starts over, and the digest is each delta's manifest digest."""
    previous = await serving_full(engine, publish, "dr-0")
    identity = "dr-0"
    for step in range(1, 6):
        current = rl_step(previous, engine_workdir / f"dr-{step}-weights", seed=10 + step)
        delta = delta_of(previous, current, engine_workdir / f"dr-{step}", f"dr-{step}", identity)
        if step == 3:
            await engine.load_weights(previous, identity, kind=SnapshotKind.FULL)
        await engine.apply_delta(delta, f"dr-{step}")
        served = await served_digests(engine)
        assert served == (f"dr-{step}", *expected_digests(current)), step
        assert (await engine.report(digest=True)).digest == manifest_digest(read_manifest(delta))
        previous, identity = current, f"dr-{step}"


async def test_after_a_patch_the_digest_is_the_manifests_and_the_cache_policy_applied(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    """The digest the engine reports after a patch (the delta's manifest digest, proven
    by the patch's tensor checks) equals the one it computes from its bits after
    loading the same weights as a directory; the cache policy lands with the patch."""
    assert patches_in_place(engine) is engine and swaps_between_tokens(engine) is engine
    full = await serving_full(engine, publish, "dg-1")
    current = rl_step(full, engine_workdir / "dg-2-weights", seed=6)
    delta = delta_of(full, current, engine_workdir / "dg-2", "dg-2", "dg-1")
    await complete(engine, "fill the prompt cache", session="dg")
    assert (await admin(engine, "GET", "/admin/cache"))["entries"]
    await engine.apply_delta(delta, "dg-2", cache_policy=KvCachePolicy.ALL)
    assert (await admin(engine, "GET", "/admin/cache"))["entries"] == []
    patched = await engine.report(digest=True)
    assert patched.identity == "dg-2"
    assert patched.digest == manifest_digest(read_manifest(delta))
    described = await admin(engine, "GET", "/admin/identity")
    assert described["deltas_applied"] >= 1
    await engine.load_between_tokens(current, "dg-2-dir", kind=SnapshotKind.FULL, cache_policy=None)
    loaded = await engine.report(digest=True)
    assert loaded.identity == "dg-2-dir" and loaded.digest == patched.digest


async def test_a_report_asked_during_a_patch_names_the_weights_its_digest_is_of(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    """A digest asked for while a patch is on its way waits for the patch; the identity
    in the same answer must be the patched one too. Before the fix the answer named the
    old snapshot with the new one's digest, and a sidecar took the engine for serving
    other weights than it names and reloaded an older buffer over the new ones."""
    full = await serving_full(engine, publish, "dt-1")
    current = rl_step(full, engine_workdir / "dt-2-weights", seed=7)
    delta = delta_of(full, current, engine_workdir / "dt-2", "dt-2", "dt-1")
    before = await engine.report(digest=True)
    await admin(engine, "POST", "/admin/swap_delay", {"seconds": 2.0})
    try:
        patch = asyncio.create_task(engine.apply_delta(delta, "dt-2"))

        async def patching() -> bool:
            return (await admin(engine, "GET", "/admin/identity")).get("loading") == "dt-2"

        assert await wait_until_async(patching, 30, interval_s=0.05), "the patch never began"
        during = await engine.report(digest=True)
        await patch
    finally:
        await admin(engine, "POST", "/admin/swap_delay", {"seconds": 0.0})
    expected = {
        "dt-1": before.digest,
        "dt-2": manifest_digest(read_manifest(delta)),
    }
    assert during.identity is not None and during.digest == expected[during.identity], (
        during,
        expected,
    )


async def test_a_stream_in_flight_keeps_going_across_the_patch(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    full = await serving_full(engine, publish, "ds-1")
    current = rl_step(full, engine_workdir / "ds-2-weights", seed=2)
    delta = delta_of(full, current, engine_workdir / "ds-2", "ds-2", "ds-1")
    # Slow tokens (0.03 s each, 200 of them) so the patch lands inside the stream on any
    # machine; the stream must then carry both identities, the old one first.
    await admin(engine, "POST", "/admin/token_delay", {"seconds": 0.03})
    try:
        stream = asyncio.create_task(complete(engine, "a long answer", max_tokens=200))

        async def generating() -> bool:
            if stream.done():
                raise AssertionError("the stream ended before the patch began")
            return bool((await admin(engine, "GET", "/admin/identity"))["active_generations"])

        assert await wait_until_async(generating, 30, interval_s=0.01), "never seen generating"
        await engine.apply_delta(delta, "ds-2")
        assert not stream.done(), "the stream ended before the patch did: nothing crossed"
        answer = await stream
    finally:
        await admin(engine, "POST", "/admin/token_delay", {"seconds": 0.0})
    assert answer["choices"][0]["text"]
    assert answer["hotload_identities"] == ["ds-1", "ds-2"]


@pytest.mark.parametrize("resign", [False, True])
async def test_a_corrupt_delta_keeps_the_old_weights_and_says_why(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path, resign: bool
) -> None:
    """Unsigned, the stored file's sha256 refuses it; re-signed, a patched tensor's
    xxh3-128 does — after the patch started, which is then undone."""
    full = await serving_full(engine, publish, f"dc{int(resign)}-1")
    current = rl_step(full, engine_workdir / f"dc{int(resign)}-2-weights", seed=3)
    delta = delta_of(
        full, current, engine_workdir / f"dc{int(resign)}-2", "dc-2", f"dc{int(resign)}-1"
    )
    before = await served_digests(engine)
    blob = next(delta.glob("hotload-delta-*.bin"))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x10
    blob.write_bytes(bytes(data))
    if resign:
        tampering.resign(delta)
    with pytest.raises(EngineRejected) as refused:
        await engine.apply_delta(delta, "dc-2")
    assert not isinstance(refused.value, DeltaNotApplicable)
    assert "ChecksumMismatch" in str(refused.value) or "DecodeFailed" in str(refused.value)
    assert await served_digests(engine) == before


async def test_a_delta_of_another_snapshot_is_refused(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    full = await serving_full(engine, publish, "do-1")
    current = rl_step(full, engine_workdir / "do-2-weights", seed=4)
    delta = delta_of(full, current, engine_workdir / "do-2", "do-2", "someone-else")
    before = await served_digests(engine)
    with pytest.raises(EngineRejected, match="another snapshot"):
        await engine.apply_delta(delta, "do-2")
    assert await served_digests(engine) == before


async def test_a_delta_that_changes_the_layout_asks_for_the_directory(
    engine: ReferenceEngine, publish: Publish, engine_workdir: Path
) -> None:
    full = await serving_full(engine, publish, "dl-1")
    extra = {"extra.bias": torch.zeros(4, dtype=torch.bfloat16)}
    current = rl_step(full, engine_workdir / "dl-2-weights", seed=5, extra=extra)
    delta = delta_of(full, current, engine_workdir / "dl-2", "dl-2", "dl-1")
    before = await served_digests(engine)
    with pytest.raises(DeltaNotApplicable):
        await engine.apply_delta(delta, "dl-2")
    assert await served_digests(engine) == before
