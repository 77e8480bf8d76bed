"""The front's gate around swaps: ASYNC holds new requests, SYNC drains and refuses."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from hotload.api import Transition
from hotload.errors import EngineBusy
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.swap_gate import HoldTimeout, SwapGate, TooEarly


def _gate(hold_timeout_s: float = 5.0) -> tuple[SwapGate, AgentMetrics]:
    metrics = AgentMetrics(CollectorRegistry())
    return SwapGate(metrics, hold_timeout_s=hold_timeout_s, retry_after_s=2), metrics


def _value(metrics: AgentMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


async def test_async_swap_holds_new_requests_and_lets_them_in_after() -> None:
    gate, metrics = _gate()
    released = asyncio.Event()
    admitted: list[str] = []

    async def swap() -> None:
        async with gate.swapping(Transition.ASYNC):
            await released.wait()

    async def request() -> None:
        await gate.enter()
        admitted.append("in")
        gate.leave()

    swapping = asyncio.create_task(swap())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(request())
    await asyncio.sleep(0.05)
    assert admitted == [] and gate.held == 1
    assert _value(metrics, "hotload_held_requests") == 1
    released.set()
    await asyncio.gather(swapping, waiting)
    assert admitted == ["in"]
    assert _value(metrics, "hotload_held_requests") == 0
    assert _value(metrics, "hotload_requests_held_total") == 1


async def test_sync_swap_waits_for_in_flight_requests_and_refuses_new_ones() -> None:
    gate, metrics = _gate()
    await gate.enter()  # a request already on the old weights
    order: list[str] = []

    async def swap() -> None:
        async with gate.swapping(Transition.SYNC):
            order.append("swapped")

    swapping = asyncio.create_task(swap())
    await asyncio.sleep(0.05)
    assert order == [], "the swap waits while a request is in flight"
    with pytest.raises(TooEarly) as early:
        await gate.enter()
    assert early.value.retry_after_s == 2
    assert _value(metrics, "hotload_requests_too_early_total") == 1
    order.append("finished")
    gate.leave()
    await swapping
    assert order == ["finished", "swapped"]
    await gate.enter()  # open again
    gate.leave()


async def test_a_held_request_gives_up_after_the_hold_timeout() -> None:
    gate, _ = _gate(hold_timeout_s=0.05)
    release = asyncio.Event()

    async def swap() -> None:
        async with gate.swapping(Transition.ASYNC):
            await release.wait()

    swapping = asyncio.create_task(swap())
    await asyncio.sleep(0)
    with pytest.raises(HoldTimeout):
        await gate.enter()
    assert gate.held == 0
    release.set()
    await swapping


async def test_two_swaps_at_once_are_refused_as_busy() -> None:
    gate, _ = _gate()
    async with gate.swapping(Transition.ASYNC):
        with pytest.raises(EngineBusy):
            async with gate.swapping(Transition.SYNC):
                pass
