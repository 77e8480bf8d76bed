"""A shared host's turns to build: few at once, the agent started first first.

Would catch: more agents building at once than the host allows, a waiting agent served in
arrival order instead of by its rank (the region's replicas would again become Ready all
together at the end), a cancelled waiter that keeps its place or swallows a turn, and an
agent in a pod of its own that waits at all. The host's agents here are stand-ins that
only take a turn; the real agent takes it around its builds (``JobRunner.run``), and
bench/propagation runs 1,000 of them.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping

import pytest
from prometheus_client import CollectorRegistry

from hotload.local.runtime.ranked_executor import AGENT_RANK
from hotload.local.runtime.ranked_slots import RankedSlots
from hotload.local.runtime.shared_host_main import SharedHost
from hotload.local.runtime.shared_protocol import StartAgent
from hotload.sidecar.build_slots import BUILD_SLOTS, build_slot


def _as_rank(rank: int, coroutine_fn, *args):  # type: ignore[no-untyped-def]
    context = contextvars.copy_context()
    context.run(AGENT_RANK.set, rank)
    return asyncio.create_task(coroutine_fn(*args), context=context)


async def test_waiting_agents_build_by_rank_and_never_more_than_the_slots() -> None:
    slots = RankedSlots(2)
    order: list[int] = []
    most = 0
    release = asyncio.Event()

    async def build(rank: int) -> None:
        nonlocal most
        async with slots.slot():
            order.append(rank)
            most = max(most, slots.busy)
            await release.wait()

    # Ranks 7 and 5 take the two free slots; the rest arrive in reverse rank order.
    tasks = [_as_rank(r, build, r) for r in (7, 5, 9, 4, 8, 0, 6)]
    for _ in range(10):
        await asyncio.sleep(0)
    assert order == [7, 5] and slots.busy == 2
    release.set()
    await asyncio.gather(*tasks)
    assert order == [7, 5, 0, 4, 6, 8, 9]
    assert most == 2 and slots.busy == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_a_turn_is_never_lost() -> None:
    slots = RankedSlots(1)
    holding = asyncio.Event()
    release = asyncio.Event()
    done: list[int] = []

    async def build(rank: int) -> None:
        async with slots.slot():
            holding.set()
            await release.wait()
            done.append(rank)

    first = _as_rank(0, build, 0)
    await holding.wait()
    cancelled = _as_rank(1, build, 1)
    last = _as_rank(2, build, 2)
    await asyncio.sleep(0)
    cancelled.cancel()  # while waiting: it leaves the queue
    release.set()
    await asyncio.wait_for(asyncio.gather(first, last), 5)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert done == [0, 2] and slots.busy == 0

    # Given a turn, then cancelled before it ran: the turn goes to the next waiter.
    held = slots.slot()
    await held.__aenter__()
    given = _as_rank(1, build, 11)
    after = _as_rank(2, build, 12)
    await asyncio.sleep(0)
    await held.__aexit__(None, None, None)  # hands the turn to `given`, without yielding
    given.cancel()
    await asyncio.wait_for(after, 5)  # a lost turn would leave it waiting for ever
    with pytest.raises(asyncio.CancelledError):
        await given
    assert done == [0, 2, 12] and slots.busy == 0


async def test_an_agent_in_its_own_pod_never_waits() -> None:
    assert BUILD_SLOTS.get() is None
    waits: list[str] = []
    async with build_slot(_Recording(waits)):
        pass  # no slots: nothing to wait for (a hang here fails on the suite's timeout)
    assert waits == []  # nor is its hold's clock ever stopped


class _Recording:
    """A ``while_waiting`` context that records when it is entered and left."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __enter__(self) -> None:
        self.log.append("wait")

    def __exit__(self, *_: object) -> None:
        self.log.append("turn")


async def test_what_runs_while_waiting_ends_when_the_turn_comes() -> None:
    """The pod writer stops its hold's clock for the wait alone (the wait is the host's,
    not the load's): it is left when the turn is given, before the build runs."""
    slots = RankedSlots(1)
    token = BUILD_SLOTS.set(slots)
    log: list[str] = []
    release = asyncio.Event()

    async def build(rank: int) -> None:
        async with build_slot(_Recording(log)):
            log.append(f"build {rank}")
            await release.wait()

    async def until(length: int) -> None:
        while len(log) < length:
            await asyncio.sleep(0)

    try:
        first = _as_rank(0, build, 0)
        await asyncio.wait_for(until(3), 5)
        second = _as_rank(1, build, 1)
        await asyncio.wait_for(until(4), 5)
        assert log == ["wait", "turn", "build 0", "wait"]  # the second waits, clock stopped
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
    finally:
        BUILD_SLOTS.reset(token)
    assert log == ["wait", "turn", "build 0", "wait", "turn", "build 1"]


async def test_a_host_hands_its_slots_to_every_agent_it_starts() -> None:
    slots = RankedSlots(1)
    seen: dict[str, object] = {}

    async def agent(env: Mapping[str, str], registry: CollectorRegistry) -> None:
        seen[env["POD_NAME"]] = (BUILD_SLOTS.get(), AGENT_RANK.get())
        await asyncio.Event().wait()

    host = SharedHost(agent, lambda event: None, slots)
    for name in ("p-0", "p-1"):
        host.start(StartAgent(name, f"ns/{name}", {"POD_NAME": name}))
    await asyncio.sleep(0.01)
    assert seen == {"p-0": (slots, 0), "p-1": (slots, 1)}
    await host.stop_all()


def test_a_host_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one build slot"):
        RankedSlots(0)
