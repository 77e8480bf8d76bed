"""A shared host's turns to build: a few agents at a time, the one started first first.

The agents' side is :mod:`hotload.sidecar.build_slots`; why a shared host needs turns is
said there. The order is the host's rank of each agent (its start order: the same rank
that orders the agents' blocking calls in :mod:`~hotload.local.runtime.ranked_executor`),
so the thread pool and the event loop favour the same agent, and the region's replicas
become Ready one after another from the first. A waiting agent that is cancelled (its
target moved, its pod stopped) leaves the queue; one cancelled just after it was given a
turn passes the turn on.

An agent holding a turn is also urgent to the host's event loop
(:mod:`hotload.local.runtime.urgent_loop`): its next step runs before the reactions of the
agents still waiting, so a build does not stretch over a thousand agents' turns.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from hotload.local.runtime.ranked_executor import AGENT_RANK
from hotload.local.runtime.urgent_loop import Urgency


class RankedSlots:
    """At most ``size`` agents of one host build at once; the lowest rank waiting goes next."""

    def __init__(self, size: int, urgency: Urgency | None = None) -> None:
        """``urgency``: told which agent holds a turn (the host's loop runs it first)."""
        if size < 1:
            raise ValueError(f"a host needs at least one build slot, not {size}")
        self.size = size
        self._urgency = urgency
        self._free = size
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def busy(self) -> int:
        """Slots held now."""
        return self.size - self._free

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self._acquire()
        rank = AGENT_RANK.get()
        if self._urgency is not None:
            self._urgency.hold(rank)
        try:
            yield
        finally:
            if self._urgency is not None:
                self._urgency.release(rank)
            self._release()

    async def _acquire(self) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (AGENT_RANK.get(), next(self._seq), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # given a turn, then cancelled before it ran: pass it on
            raise

    def _release(self) -> None:
        while self._waiting:
            *_, turn = heapq.heappop(self._waiting)
            if not turn.done():  # a cancelled waiter's turn is done: skip it
                turn.set_result(None)
                return
        self._free += 1
