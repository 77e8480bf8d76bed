"""The reference engine's coordinated switch: a load staged beside serving, swapped in at a
requested wall-clock instant between two tokens, and the engine's own record of when."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from hotload.api import SnapshotKind
from hotload.engines import ReferenceEngine
from hotload.engines.capabilities import stages_switch
from hotload.engines.reference import model as rm
from hotload.engines.reference.app import create_app
from hotload.engines.reference.runtime import GenerationRequest, GenerationStats, ReferenceRuntime
from hotload.errors import EngineRejected
from hotload.snapshot import encode_full, manifest_digest, read_manifest


def _snapshot(tmp_path: Path, config: object, seed: int, identity: str) -> tuple[Path, str]:
    weights = tmp_path / f"weights-{seed}"
    rm.save_snapshot(rm.build_model(config, seed=seed), weights)  # type: ignore[arg-type]
    encode_full(weights, tmp_path / f"snap-{seed}", identity=identity, step=seed)
    return weights, manifest_digest(read_manifest(tmp_path / f"snap-{seed}"))


async def test_a_staged_load_swaps_at_the_requested_instant_between_two_tokens(
    tmp_path: Path,
) -> None:
    config = rm.build_config("tiny")
    first, _ = _snapshot(tmp_path, config, 1, "s-1")
    second, digest = _snapshot(tmp_path, config, 2, "s-2")
    runtime = ReferenceRuntime(config)
    await runtime.load(first, "s-1", SnapshotKind.FULL)
    await runtime.stage(second, "s-2", SnapshotKind.FULL)
    described = runtime.describe()
    assert (described["identity"], described["staged"]) == ("s-1", "s-2")

    # A generation streams across the switch: every token before the instant is s-1's.
    runtime.token_delay_s = 0.01
    seen: list[tuple[float, str]] = []

    async def stream() -> None:
        request = GenerationRequest(prompt=(1, 2, 3), max_tokens=400)
        async for token in runtime.generate(request, GenerationStats()):
            seen.append((time.time(), token.identity))
            if token.identity == "s-2" and len(seen) > 5:
                return

    streaming = asyncio.create_task(stream())
    at = time.time() + 0.4
    await runtime.switch("s-2", at=at)
    await asyncio.wait_for(streaming, 60)
    record = runtime.describe()["swap_log"][-1]
    assert (record["identity"], record["how"], record["requested_at"]) == ("s-2", "switch", at)
    # Never before the instant; on it give or take one forward step on a loaded machine
    # (the spread itself is measured on real replicas: the sidecar's integration test).
    assert at <= record["at"] < at + 1.0
    assert all(identity == "s-1" for moment, identity in seen if moment < at)
    assert any(identity == "s-1" for _, identity in seen)
    assert seen[-1][1] == "s-2"
    assert await runtime.tensor_digest() == digest
    assert runtime.describe()["staged"] is None


async def test_a_switch_with_nothing_staged_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    config = rm.build_config("tiny")
    first, digest = _snapshot(tmp_path, config, 1, "s-1")
    runtime = ReferenceRuntime(config)
    await runtime.load(first, "s-1", SnapshotKind.FULL)
    with pytest.raises(EngineRejected):
        await runtime.switch("s-2", at=None)
    assert runtime.describe()["identity"] == "s-1"
    assert await runtime.tensor_digest() == digest


async def test_a_stage_outdated_by_another_swap_is_prepared_again(tmp_path: Path) -> None:
    """Would catch a switch writing only the elements that differed from weights served
    before another swap (a staged preparation is relative to what was served then)."""
    config = rm.build_config("tiny")
    first, _ = _snapshot(tmp_path, config, 1, "s-1")
    second, digest = _snapshot(tmp_path, config, 2, "s-2")
    third, _ = _snapshot(tmp_path, config, 3, "s-3")
    runtime = ReferenceRuntime(config, compute_dtype=rm.storage_dtype(config))
    await runtime.load(first, "s-1", SnapshotKind.FULL)
    await runtime.stage(second, "s-2", SnapshotKind.FULL)
    await runtime.load(third, "s-3", SnapshotKind.FULL)
    await runtime.switch("s-2")
    assert runtime.describe()["identity"] == "s-2"
    assert await runtime.tensor_digest() == digest
    assert [r["how"] for r in runtime.describe()["swap_log"]] == ["load", "load", "switch"]


async def test_the_adapter_stages_and_switches_through_the_engine_s_own_routes(
    tmp_path: Path,
) -> None:
    """The sidecar's calls (StagesSwitch) against the real app: the stage is named, the
    switch lands at the instant asked and the answer is the engine's own instant."""
    config = rm.build_config("tiny")
    first, _ = _snapshot(tmp_path, config, 1, "s-1")
    second, digest = _snapshot(tmp_path, config, 2, "s-2")
    runtime = ReferenceRuntime(config)
    await runtime.load(first, "s-1", SnapshotKind.FULL)
    app = create_app(runtime, served_name="policy")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://e") as client:
        engine = ReferenceEngine("http://e", client)
        assert stages_switch(engine) is engine
        assert await engine.staged_identity() is None
        await engine.stage(second, "s-2", kind=SnapshotKind.FULL)
        assert await engine.staged_identity() == "s-2"
        with pytest.raises(EngineRejected):
            await engine.switch_at("s-3", None, cache_policy=None)
        at = datetime.now(UTC) + timedelta(milliseconds=300)
        took = await engine.switch_at("s-2", at, cache_policy=None)
        assert at <= took < at + timedelta(seconds=1)
        assert (await engine.report()).identity == "s-2"
        assert await engine.staged_identity() is None
    assert await runtime.tensor_digest() == digest
