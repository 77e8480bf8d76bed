"""Whether this agent may build now: always in its own pod; by turns in a shared host.

A sidecar in its own pod builds on its own cores and never waits here. The local pod
runtime's shared mode runs a thousand agents in one process on a machine of two cores:
with every agent building at once, each build's steps wait a full turn of the event loop
behind every other agent's step, so every replica of the region is Ready together at the
end, after all of the fleet's work, and the contention itself costs CPU. A shared host
gives its agents a :class:`BuildSlots` (through :data:`BUILD_SLOTS`, which each agent's
context inherits, as it inherits its rank), and an agent holds a slot while it builds and
loads a target: the replicas finish one after another, as separate machines would, the
first within one build's time. The agent's code is the same in both places.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    asynccontextmanager,
    nullcontext,
)
from contextvars import ContextVar
from typing import Protocol


class BuildSlots(Protocol):
    """Turns to build, shared by the agents of one process."""

    def slot(self) -> AbstractAsyncContextManager[None]:
        """Held while one agent builds and loads a target."""
        ...


#: The slots of the process this agent runs in; None (a pod of its own): no waiting.
BUILD_SLOTS: ContextVar[BuildSlots | None] = ContextVar("hotload_build_slots", default=None)


@asynccontextmanager
async def build_slot(
    while_waiting: AbstractContextManager[object] = nullcontext(),
) -> AsyncIterator[None]:
    """Hold this agent's turn to build (at once when it runs in a pod of its own).

    ``while_waiting`` is entered for the wait alone (the pod writer stops its hold's clock:
    the wait is the host's, not the load's); a pod of its own never enters it."""
    slots = BUILD_SLOTS.get()
    if slots is None:
        yield
        return
    async with AsyncExitStack() as stack:
        with while_waiting:
            await stack.enter_async_context(slots.slot())
        yield
