"""A shared host's event loop: the agents that are building run their next step first.

A shared host turns a thousand agents' sidecars into tasks of one event loop. When a
target moves, all of them react within the same second (a watch event each, a pass, a
wait for a build turn), and a plain loop runs callbacks in the order they were
scheduled: each step of the few agents that hold a turn to build (a thread's answer, a
read, the report's request) waits behind up to a thousand other agents' reactions, so
the first replica is Ready only once the loop has taken in the whole fleet's reaction
(1.8-3.4 s at 1,000 replicas, against 0.3 s when the agents only report:
bench/propagation/one-region-1000/analysis.md). A sidecar in its own pod has a loop of
its own and never waits like this.

This loop puts the ready callbacks of an **urgent** agent ahead of the others, in the
order they were scheduled among themselves. An agent is urgent while it holds a build
turn (:mod:`hotload.local.runtime.ranked_slots` marks it) and for :data:`LINGER_S` after,
so that the report of what it just loaded goes out before the next agents' reactions
too; the host's first agents (as many as it has turns) are urgent always, so that they
take in a new target and the free turns first (:class:`Urgency`). Which agent a callback
belongs to is its context's :data:`AGENT_RANK`, which every task of an agent inherits
(a socket's reader keeps the context that opened it); the host's thread pool sets its
answers in the caller's context (:mod:`hotload.local.runtime.ranked_executor`), so a
thread's answer to an urgent agent is urgent as well. Nothing else changes: the same
callbacks run, each once, and the others keep their order; only who waits for whom. An
urgent agent that never waited for anything could hold the loop, but builds wait on
threads, files and the network, and the always-urgent agents are a handful.

The hooks are two private methods of CPython 3.11's ``asyncio/base_events.py``:
``_call_soon`` (line 780), through which ``call_soon`` and ``call_soon_threadsafe``
schedule every callback (task steps and future callbacks included), and
``_add_callback`` (line 1830), through which the selector's ready sockets are queued.
``_run_once`` (line 1905) runs the callbacks present when it starts, popping ``_ready``
from its left, so one inserted at the left runs within the current turn. Timers keep
their place: the task steps they wake are scheduled through ``_call_soon``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from asyncio import events
from collections.abc import Callable
from typing import Any, Final

from hotload.local.runtime.ranked_executor import AGENT_RANK

#: How long an agent stays urgent after its build turn ends: its report is one pod patch,
#: a few turns of the loop and one round trip to the API server.
LINGER_S: Final = 1.0


class Urgency:
    """Which agents (by rank) are urgent now: while they hold a turn, then ``linger_s``;
    and always the host's first ``first_ranks`` agents.

    The first agents are the host's stand-in for the fastest machines of a fleet: when a
    target moves, they take in their watch event, plan and take the free turns before the
    rest of the host reacts, as a replica in a pod of its own would, instead of wherever
    their events fall among a thousand. Later turns go by rank, and whoever holds one is
    urgent."""

    def __init__(
        self,
        first_ranks: int = 0,
        linger_s: float = LINGER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``first_ranks``: the agents of ranks below it are always urgent (see
        :class:`Urgency`)."""
        if linger_s < 0:
            raise ValueError(f"an urgent agent cannot linger {linger_s} s")
        if first_ranks < 0:
            raise ValueError(f"a host cannot have {first_ranks} first ranks")
        self.first_ranks = first_ranks
        self.linger_s = linger_s
        self._clock = clock
        self._holding: dict[int, int] = {}
        """Turns held per rank (an agent could hold two, one per job)."""
        self._until: dict[int, float] = {}
        """Ranks whose turns ended, and until when they stay urgent."""

    def hold(self, rank: int) -> None:
        """The agent of ``rank`` was given a turn."""
        if rank < 0:
            return
        self._holding[rank] = self._holding.get(rank, 0) + 1

    def release(self, rank: int) -> None:
        """The agent of ``rank`` gave a turn back; it stays urgent ``linger_s`` more."""
        held = self._holding.get(rank, 0)
        if held <= 0:
            return
        if held == 1:
            del self._holding[rank]
        else:
            self._holding[rank] = held - 1
        self._until[rank] = self._clock() + self.linger_s

    def urgent(self, rank: int) -> bool:
        if rank < 0:
            return False
        if rank < self.first_ranks or rank in self._holding:
            return True
        until = self._until.get(rank)
        if until is None:
            return False
        if self._clock() < until:
            return True
        self._until.pop(rank, None)
        return False

    @property
    def ranks(self) -> frozenset[int]:
        """The ranks urgent now besides the first ones (for tests and logs)."""
        return frozenset(rank for rank in {*self._holding, *self._until} if self.urgent(rank))


class UrgentFirstLoop(asyncio.SelectorEventLoop):
    """A selector event loop that runs urgent agents' ready callbacks first (see module)."""

    @staticmethod
    def supported() -> bool:
        """Whether this Python's event loop has the private hooks this loop needs (a later
        CPython may not: the host then runs a plain loop, see :func:`run_host`)."""
        base = asyncio.SelectorEventLoop
        probe = base()
        try:
            return all(hasattr(base, name) for name in ("_call_soon", "_add_callback")) and (
                hasattr(probe, "_ready") and hasattr(probe._ready, "insert")
            )
        finally:
            probe.close()

    def __init__(self, urgency: Urgency) -> None:
        super().__init__()
        self.urgency = urgency
        self.urgent_callbacks = 0
        """Callbacks scheduled ahead of the others so far (for tests and benches)."""

    def _urgent(self, context: contextvars.Context) -> bool:
        rank = context.get(AGENT_RANK, -1)
        return rank >= 0 and self.urgency.urgent(rank)

    def _call_soon(
        self, callback: Callable[..., object], args: Any, context: contextvars.Context | None
    ) -> events.Handle:
        if context is None:
            context = contextvars.copy_context()
        if not self._urgent(context):
            plain: events.Handle = super()._call_soon(callback, args, context)  # type: ignore[misc]
            return plain
        handle = events.Handle(callback, args, self, context)
        if handle._source_traceback:  # type: ignore[attr-defined]
            del handle._source_traceback[-1]  # type: ignore[attr-defined]
        self._put_first(handle)
        return handle

    def _add_callback(self, handle: events.Handle) -> None:
        """A socket that is ready (the selector's answer): its agent's read goes first too."""
        if handle.cancelled():
            return
        if self._urgent(handle._context):  # type: ignore[attr-defined]
            self._put_first(handle)
        else:
            self._ready.append(handle)  # type: ignore[attr-defined]

    def _put_first(self, handle: events.Handle) -> None:
        """After the urgent callbacks already at the head of the queue.

        The head is found by index, never by iterating: another thread may append to the
        queue meanwhile (a thread's answer through ``call_soon_threadsafe``), and a deque
        must not change while it is iterated. From a thread the loop may also pop
        meanwhile; then the position is off by what it ran, which changes how early the
        callback runs, never whether it runs."""
        ready = self._ready  # type: ignore[attr-defined]
        index = 0
        try:
            while self._urgent(ready[index]._context):
                index += 1
        except IndexError:
            pass
        ready.insert(index, handle)
        self.urgent_callbacks += 1


def urgent_first_runner(urgency: Urgency) -> asyncio.Runner:
    """An ``asyncio.Runner`` whose loop is an :class:`UrgentFirstLoop` over ``urgency``."""
    return asyncio.Runner(loop_factory=lambda: UrgentFirstLoop(urgency))
