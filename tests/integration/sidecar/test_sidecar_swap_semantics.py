"""What clients of the front see across a swap: SYNC answers 425, ASYNC spans policies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from hotload.api import Transition
from tests.fixtures.trainer import Trainer
from tests.integration.sidecar.harness import (
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
    token_delay,
)

pytestmark = pytest.mark.cluster

SESSION = {"x-multi-turn-session-id": "session-42"}
#: Long enough that the stream is still running when the sidecar reaches its swap.
LONG = 200


async def _stream(
    replica: Replica, started: asyncio.Event
) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    """A streamed completion through the front; its headers and every chunk, in order."""
    chunks: list[dict[str, Any]] = []
    body = {
        "model": replica.env["HOTLOAD_DEPLOYMENT"],
        "prompt": "The policy says",
        "max_tokens": LONG,
        "stream": True,
    }
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(30, read=120)) as client,
        client.stream(
            "POST", f"{replica.front}/v1/completions", json=body, headers=SESSION
        ) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
                if len(chunks) >= 3:
                    started.set()
        return response.headers, chunks


async def _ready_at(harness: SidecarHarness, replica: Replica, trainer: Trainer, name: str) -> Any:
    full = await trainer.publish_full()
    harness.set_target(name, full.ref())
    await harness.wait_state(replica, full.identity, "Ready")
    trainer.train_step()
    return full, await trainer.publish_delta()


async def test_sync_swap_answers_425_and_the_retry_gets_the_new_policy(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    harness.create_deployment(rollout_deployment("sync", bucket_url, transition=Transition.SYNC))
    replica = await harness.replica("sync-0", "sync")
    old, new = await _ready_at(harness, replica, trainer, "sync")

    # ~10 s of tokens: long enough to see the drain on any machine, within its 60 s limit.
    await token_delay(replica, 0.05)
    started = asyncio.Event()
    in_flight = asyncio.create_task(_stream(replica, started))
    await asyncio.wait_for(started.wait(), 30)
    harness.set_target("sync", new.ref())

    async def draining() -> bool:
        return (await harness.status(replica))["phase"] == "Draining"

    try:
        await eventually(draining, timeout=30, what="the SYNC swap to wait for the stream")
    finally:
        await token_delay(replica, 0.0)
    early = await harness.complete(replica, headers=SESSION)
    assert early.status_code == 425, early.text
    assert int(early.headers["retry-after"]) >= 1
    assert early.headers["x-hotload-policy"] == old.identity, "a refusal names the policy too"

    headers, chunks = await in_flight
    assert chunks and chunks[-1]["choices"][0]["finish_reason"] is not None
    assert {c["model"] for c in chunks} == {f"sync@{old.identity}"}, "finished on the old weights"
    assert headers["x-hotload-policy"] == old.identity

    await harness.wait_state(replica, new.identity, "Ready")
    retry = await harness.complete(replica, headers=SESSION)
    assert retry.status_code == 200
    assert retry.json()["model"] == f"sync@{new.identity}"
    assert retry.headers["x-hotload-policy"] == new.identity


async def test_async_swap_resumes_a_stream_on_the_new_policy_without_error(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    harness.create_deployment(rollout_deployment("async", bucket_url, transition=Transition.ASYNC))
    replica = await harness.replica("async-0", "async")
    old, new = await _ready_at(harness, replica, trainer, "async")

    started = asyncio.Event()
    in_flight = asyncio.create_task(_stream(replica, started))
    await asyncio.wait_for(started.wait(), 30)
    harness.set_target("async", new.ref())
    await harness.wait_state(replica, new.identity, "Ready")
    assert not in_flight.done(), "the stream should still be running across the swap"

    headers, chunks = await in_flight
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    models = [c["model"] for c in chunks]
    first_new = models.index(f"async@{new.identity}")
    assert first_new > 0
    assert set(models[:first_new]) == {f"async@{old.identity}"}
    assert set(models[first_new:]) == {f"async@{new.identity}"}, "policies appear in order"
    assert headers["x-hotload-policy"] == old.identity

    # The session header passes through to the engine (its prompt cache is keyed by it).
    after = await harness.complete(replica, headers=SESSION)
    assert after.json()["model"] == f"async@{new.identity}"
    async with httpx.AsyncClient() as client:
        cache = (await client.get(f"{replica.engine_url}/admin/cache", timeout=10)).json()
    assert any(
        entry.get("session") == SESSION["x-multi-turn-session-id"] for entry in cache["entries"]
    )
