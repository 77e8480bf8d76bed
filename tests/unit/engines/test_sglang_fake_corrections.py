"""The three SGLang 0.5.23 behaviours the fake once had wrong, each driven through the adapter.

The fake used to let an adapter be unloaded while its requests were paused in place,
answer ``/ready`` 200 during a pause, and flush a retracted engine with a timeout; the
release does none of these (hotload/testing/sglang_app.py cites where). Against the
corrected fake, each test here fails on the adapter written for the old fake: the swap
between adapters hangs on the unload, a paused engine never becomes ready to drive, the
``all`` policy's flush is refused twice and raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, SGLangEngine
from hotload.testing.sglang_app import SGLangOptions, create_app
from tests.unit.engines.test_fake_engines import snapshot

TOKEN_S = 0.005
BASE = "http://sglang"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    options = SGLangOptions(
        model_path="/models/base",
        served_name="base",
        token_interval=TOKEN_S,
        enable_lora=True,
        max_lora_rank=8,
        lora_target_modules=("all",),
    )
    transport = httpx.ASGITransport(app=create_app(options))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
        yield c


async def fake_state(client: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get("/hotload_fake/state")).json()
    return body


async def generate(
    client: httpx.AsyncClient, engine: SGLangEngine, prompt: str, max_tokens: int
) -> httpx.Response:
    """A completion as the sidecar's front forwards it (the adapter prepares the body)."""
    body = engine.prepare_request(
        "/v1/completions", {"model": "base", "prompt": prompt, "max_tokens": max_tokens}
    )
    return await client.post("/v1/completions", json=body)


async def running(client: httpx.AsyncClient, task: asyncio.Task[httpx.Response]) -> None:
    for _ in range(400):
        if (await fake_state(client))["running"]:
            return
        assert not task.done(), task.result().text
        await asyncio.sleep(0.005)
    raise AssertionError("the generation never started")


async def test_a_paused_swap_between_adapters_never_waits_on_the_unload(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The unload of the replaced adapter waits for its requests, which the pause holds:
    sent while paused it would hang the swap (and every held request) until it timed out."""
    engine = SGLangEngine(BASE, client, flush_timeout=5.0)
    first, second = snapshot(tmp_path / "l1", 1), snapshot(tmp_path / "l2", 2)
    await engine.load_weights(first, "l1", kind=SnapshotKind.LORA)
    request = asyncio.create_task(generate(client, engine, "p", 60))
    await running(client, request)
    await engine.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.NONE)
    async with asyncio.timeout(2.0):
        await engine.load_weights(second, "l2", kind=SnapshotKind.LORA)
        assert (await engine.report()).identity == "l2"  # the version was named
        await engine.resume()
    assert (await request).status_code == 200  # finished on its adapter
    lora = (await fake_state(client))["lora"]
    assert list(lora["registered"]) == ["l2"] and not lora["pending_unloads"]
    answer = await generate(client, engine, "q", 2)
    assert (
        answer.status_code == 200
        and engine.prepare_request("/v1/completions", {"model": "base"})["lora_path"] == "l2"
    )


async def test_an_engine_left_paused_is_healthy_and_can_be_driven(
    client: httpx.AsyncClient,
) -> None:
    """``/ready`` answers 503 for the whole of a pause: a sidecar restarted while its
    engine was paused must still find it up, or it never loads, and never resumes it."""
    await client.post("/pause_generation", json={"mode": "in_place"})
    assert (await client.get("/ready")).status_code == 503
    engine = SGLangEngine(BASE, client)
    await engine.wait_ready(timeout=1.0)
    assert await engine.health() is True
    await engine.resume()
    assert (await fake_state(client))["paused"] is None


async def test_the_all_policy_flushes_while_paused_though_retract_fills_the_queue(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """Retract re-queues the running requests; a flush with a timeout waits for that
    queue to empty, so it fails after the whole timeout (paused all along) and again
    after the resume under traffic, leaving old-weight KV to be reused."""
    engine = SGLangEngine(BASE, client, flush_timeout=0.5)
    assert (await generate(client, engine, "cached", 2)).status_code == 200  # a cache entry
    request = asyncio.create_task(generate(client, engine, "long", 150))
    await running(client, request)
    await engine.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.ALL)
    await engine.load_weights(snapshot(tmp_path / "s1", 1), "s1", kind=SnapshotKind.FULL)
    await engine.resume()
    await engine.reset_cache(KvCachePolicy.ALL)
    counters = (await fake_state(client))["counters"]
    assert counters["flushes"] == 1 and counters["reprefilled"] == 1
    assert (await generate(client, engine, "cached", 2)).status_code == 200
    assert (await request).status_code == 200
    assert (await fake_state(client))["counters"].get("stale_cache_hits", 0) == 0
