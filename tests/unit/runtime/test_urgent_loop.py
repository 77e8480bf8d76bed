"""A shared host's loop runs the building agents' steps before the others' reactions.

Would catch: an urgent agent's steps (task wake-ups, a thread's answer through
``call_soon_threadsafe``) queued behind a storm of other agents' callbacks, as on a plain
loop (the first replica of a 1,000-replica host waited for the fleet's reaction); urgent
callbacks reordered among themselves; an agent that stays urgent after its turn and its
linger, or is not urgent while it holds a turn; a callback lost or run twice. Real
event loops, real threads; the storm is tasks that yield, as a thousand agents' reactions
do.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

from hotload.local.runtime import shared_host_main
from hotload.local.runtime.ranked_executor import AGENT_RANK, RankedExecutor
from hotload.local.runtime.ranked_slots import RankedSlots
from hotload.local.runtime.urgent_loop import (
    Urgency,
    UrgentFirstLoop,
    urgent_first_runner,
)

STORM = 300
STORM_STEPS = 40
AGENT_STEPS = 20


def _agent_context(rank: int) -> contextvars.Context:
    """A context as an agent of ``rank`` runs in (its tasks inherit it)."""
    context = contextvars.copy_context()
    context.run(AGENT_RANK.set, rank)
    return context


def _in_agent(rank: int, coroutine: Awaitable[object]) -> asyncio.Task[object]:
    context = _agent_context(rank)
    return asyncio.get_running_loop().create_task(coroutine, context=context)  # type: ignore[arg-type]


async def _storm_steps_until_done(
    agent_step: Callable[[], Awaitable[object]], urgency: Urgency, urgent: bool, work_s: float = 0
) -> int:
    """How many steps the other agents took while agent 0 took its ``AGENT_STEPS``.

    ``work_s``: each other agent's step holds the GIL that long (a reaction's work)."""
    steps = 0

    async def other() -> None:
        nonlocal steps
        for _ in range(STORM_STEPS):
            steps += 1
            end = time.perf_counter() + work_s
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)

    async def agent() -> int:
        for _ in range(AGENT_STEPS):
            await agent_step()
        return steps

    storm = [_in_agent(100 + i, other()) for i in range(STORM)]
    await asyncio.sleep(0)  # the storm is under way, every task queued once
    if urgent:
        urgency.hold(0)
    seen = await _in_agent(0, agent())
    await asyncio.gather(*storm)
    assert steps == STORM * STORM_STEPS  # every other callback ran, each once
    assert isinstance(seen, int)
    return seen


def _run(coroutine_fn: Callable[[Urgency], Awaitable[int]]) -> int:
    urgency = Urgency()
    with urgent_first_runner(urgency) as runner:
        assert isinstance(runner.get_loop(), UrgentFirstLoop)
        return runner.run(coroutine_fn(urgency))  # type: ignore[arg-type]


def test_this_python_has_the_hooks_the_urgent_lane_needs() -> None:
    assert UrgentFirstLoop.supported()


def test_an_urgent_agents_steps_go_before_a_storm_of_other_agents() -> None:
    def sleep0() -> Awaitable[None]:
        return asyncio.sleep(0)

    urgent = _run(lambda u: _storm_steps_until_done(sleep0, u, urgent=True))
    plain = _run(lambda u: _storm_steps_until_done(sleep0, u, urgent=False))
    # Urgent: its 20 steps within the storm's first turn. Plain: one storm turn per step.
    assert urgent <= 2 * STORM
    assert plain >= (AGENT_STEPS - 1) * STORM


def test_a_threads_answer_to_an_urgent_agent_is_urgent_too() -> None:
    def one_thread_call(pool: RankedExecutor) -> Callable[[], Awaitable[int]]:
        def step() -> Awaitable[int]:
            return asyncio.get_running_loop().run_in_executor(pool, int, "1")

        return step

    async def run(urgency: Urgency, urgent: bool) -> int:
        pool = RankedExecutor(2, urgency=urgency)
        try:
            return await _storm_steps_until_done(
                one_thread_call(pool), urgency, urgent, work_s=100e-6
            )
        finally:
            pool.shutdown()

    urgent = _run(lambda u: run(u, True))
    plain = _run(lambda u: run(u, False))
    # Each thread hop of a plain agent waits for at least one storm turn (30 ms here); an
    # urgent one's answer comes back at the head of the queue, once the thread has had the
    # GIL (Python's switch interval, 5 ms: ~50 storm steps).
    assert plain >= (AGENT_STEPS - 1) * STORM
    assert urgent <= plain / 3


def test_urgent_callbacks_go_first_in_their_own_order_and_the_rest_keep_theirs() -> None:
    async def schedule(urgency: Urgency) -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        done = loop.create_future()
        urgency.hold(3)
        agent, other = _agent_context(3), _agent_context(8)
        for name, context in (
            ("x", other),
            ("a", agent),
            ("y", other),
            ("b", agent),
            ("z", None),
            ("c", agent),
        ):
            loop.call_soon(ran.append, name, context=context)
        loop.call_soon(done.set_result, None)
        await done
        assert loop.urgent_callbacks == 3  # type: ignore[attr-defined]
        return ran

    urgency = Urgency()
    with urgent_first_runner(urgency) as runner:
        assert runner.run(schedule(urgency)) == ["a", "b", "c", "x", "y", "z"]


def test_call_soon_threadsafe_from_an_urgent_context_goes_first() -> None:
    async def schedule(urgency: Urgency) -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        done = loop.create_future()
        urgency.hold(1)
        loop.call_soon(ran.append, "before")

        def from_thread() -> None:
            context = _agent_context(1)
            context.run(loop.call_soon_threadsafe, ran.append, "urgent")
            loop.call_soon_threadsafe(done.set_result, None)

        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join()
        await done
        return ran

    urgency = Urgency()
    with urgent_first_runner(urgency) as runner:
        assert runner.run(schedule(urgency)) == ["urgent", "before"]


def test_an_agent_is_urgent_while_it_holds_a_turn_and_for_the_linger_after() -> None:
    now = [100.0]
    urgency = Urgency(linger_s=1.0, clock=lambda: now[0])
    assert not urgency.urgent(4)
    urgency.hold(4)
    urgency.hold(4)  # two jobs' turns
    urgency.release(4)
    now[0] += 5
    assert urgency.urgent(4)  # still holds one
    urgency.release(4)
    now[0] += 0.9
    assert urgency.urgent(4) and urgency.ranks == {4}
    now[0] += 0.2
    assert not urgency.urgent(4) and urgency.ranks == frozenset()
    urgency.release(4)  # a release without a hold changes nothing
    assert not urgency.urgent(4)
    urgency.hold(-1)  # outside any agent: never urgent
    assert not urgency.urgent(-1)
    with pytest.raises(ValueError, match="linger"):
        Urgency(linger_s=-1)


def test_the_hosts_first_agents_are_always_urgent() -> None:
    urgency = Urgency(first_ranks=4)
    assert [rank for rank in range(-1, 7) if urgency.urgent(rank)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="first ranks"):
        Urgency(first_ranks=-1)


def test_a_ready_socket_of_an_urgent_agent_is_read_first() -> None:
    async def read(urgency: Urgency) -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        done = loop.create_future()
        urgency.hold(2)
        pairs = []
        for name, rank in (("other", 9), ("urgent", 2)):
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            pairs.append((ours, theirs))
            context = _agent_context(rank)

            def on_readable(sock: socket.socket = ours, name: str = name) -> None:
                sock.recv(16)
                ran.append(name)
                if len(ran) == 2:
                    done.set_result(None)

            context.run(loop.add_reader, ours.fileno(), on_readable)  # type: ignore[arg-type]
            theirs.send(b"x")
        try:
            await done
        finally:
            for ours, theirs in pairs:
                loop.remove_reader(ours.fileno())
                ours.close()
                theirs.close()
        return ran

    urgency = Urgency()
    with urgent_first_runner(urgency) as runner:
        assert runner.run(read(urgency)) == ["urgent", "other"]


async def test_a_build_turn_makes_its_holder_urgent_and_giving_it_back_ends_that() -> None:
    urgency = Urgency(linger_s=0.0)
    slots = RankedSlots(1, urgency)
    inside = asyncio.Event()
    leave = asyncio.Event()

    async def build() -> None:
        async with slots.slot():
            inside.set()
            await leave.wait()

    task = _in_agent(6, build())
    await inside.wait()
    assert urgency.urgent(6)
    leave.set()
    await task
    assert not urgency.urgent(6)


def test_a_ranked_host_runs_on_the_urgent_loop_and_a_plain_one_without_its_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, urgency = shared_host_main.host_runner("ranked")
    with runner:
        assert isinstance(runner.get_loop(), UrgentFirstLoop)
    assert urgency is not None and urgency.first_ranks == shared_host_main.build_slots()
    runner, urgency = shared_host_main.host_runner("fifo")
    with runner:
        assert not isinstance(runner.get_loop(), UrgentFirstLoop) and urgency is None
    # A Python without the private hooks cannot run here: its answer is stood in for.
    monkeypatch.setattr(UrgentFirstLoop, "supported", staticmethod(lambda: False))
    runner, urgency = shared_host_main.host_runner("ranked")
    with runner:
        assert not isinstance(runner.get_loop(), UrgentFirstLoop) and urgency is None
