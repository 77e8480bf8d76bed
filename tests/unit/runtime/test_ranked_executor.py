"""The shared host's pool runs the blocking calls of the agent started first first.

Would catch: a FIFO pool (every replica of a shared host finishing together, the first
report waiting for the whole fleet's loads), ranks not inherited by an agent's child
tasks, calls lost or run twice, an exception not reaching its caller, the calls of an agent
that is building (urgent) queued behind other agents'.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from hotload.local.runtime.ranked_executor import AGENT_RANK, RankedExecutor
from hotload.local.runtime.urgent_loop import Urgency


def _order_run(pool: RankedExecutor, ranks: tuple[int, ...]) -> list[int]:
    """The order in which a one-thread pool runs calls queued from ``ranks`` in turn."""
    gate = threading.Event()
    order: list[int] = []
    blocker = pool.submit(gate.wait, 5)
    futures = []
    for rank in ranks:
        token = AGENT_RANK.set(rank)
        try:
            futures.append(pool.submit(order.append, rank))
        finally:
            AGENT_RANK.reset(token)
    gate.set()
    assert blocker.result(5) is True
    for future in futures:
        future.result(5)
    pool.shutdown()
    return order


def test_queued_calls_run_lowest_rank_first_and_all_run_once() -> None:
    assert _order_run(RankedExecutor(1), (5, 2, 9, 0, 2)) == [0, 2, 2, 5, 9]


def test_an_urgent_agents_calls_go_before_every_other_agents() -> None:
    urgency = Urgency()
    urgency.hold(9)  # building now (urgent_loop.py)
    assert _order_run(RankedExecutor(1, urgency=urgency), (0, 9, 2, 9)) == [9, 9, 0, 2]


def test_an_agents_child_tasks_inherit_its_rank_through_to_thread() -> None:
    async def agent(seen: list[int]) -> None:
        async def child() -> None:
            seen.append(await asyncio.to_thread(AGENT_RANK.get))

        async with asyncio.TaskGroup() as group:
            group.create_task(child())

    async def host() -> list[int]:
        asyncio.get_running_loop().set_default_executor(RankedExecutor(2))
        seen: list[int] = []
        context = contextvars.copy_context()
        context.run(AGENT_RANK.set, 7)
        await asyncio.get_running_loop().create_task(agent(seen), context=context)
        return seen

    assert asyncio.run(host()) == [7]


def test_a_failing_call_raises_in_its_caller() -> None:
    pool = RankedExecutor(2)

    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        pool.submit(boom).result(5)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(print)
