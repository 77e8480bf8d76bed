"""Keep a shared host's long-lived objects out of the cyclic collector's full passes.

A shared host holds a thousand agents' objects (their clients, sessions, watches, models,
registries): ~850,000 objects the garbage collector tracks. CPython runs a full collection
whenever a quarter as many new objects have survived to its oldest generation, and a full
collection walks every one of them with the GIL held: measured in a 1,000-replica host
(bench/propagation/one-region-1000, "The collector's pauses"), 0.9-1.5 s each, every
10-30 s while agents start and load, and one of them in a delta's first seconds stopped
every agent there, the first replica's build among them. An agent in a pod of its
own tracks a thousandth of that and never pauses so.

So the host moves what has survived into the permanent generation (``gc.freeze``) every
``freeze_every_s``, after a collection of the young generations (their garbage goes
first, so little of it is frozen); full collections then walk only what is newer than the
last freeze. Frozen objects are never collected: reference counting still frees most of a
stopped agent's, but its cycles, and those of a load that died after a freeze, wait for a
reclaim (``gc.unfreeze``, one full collection, ``gc.freeze``). One follows any agent's
stop, at most every ``freeze_every_s``, and one comes every ``reclaim_every_s`` in any
case: a pause per reclaim instead of one every few seconds, and what a dead cycle holds
freed within that bound.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

log = logging.getLogger(__name__)

#: Seconds between freezes: short enough that a rollout's new long-lived objects (the
#: loads' manifests, reports, connections) stay a small part of the collector's heap.
FREEZE_EVERY_S = 30.0
#: Seconds between reclaims when no agent stops: what bounds the memory held by cycles
#: that died after a freeze.
RECLAIM_EVERY_S = 600.0


class HeapStep(StrEnum):
    FREEZE = "freeze"
    """Young generations collected, every survivor frozen."""
    RECLAIM = "reclaim"
    """Everything unfrozen, one full collection, the survivors frozen again."""


@dataclass
class HeapKeeper:
    """When to freeze and when to reclaim; :meth:`run` does it on a timer."""

    freeze_every_s: float = FREEZE_EVERY_S
    reclaim_every_s: float = RECLAIM_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _last_reclaim: float = field(init=False)
    _stopped: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.freeze_every_s <= 0 or self.reclaim_every_s < self.freeze_every_s:
            raise ValueError(
                "a heap keeper freezes at a positive interval and reclaims no more often: "
                f"freeze every {self.freeze_every_s} s, reclaim every {self.reclaim_every_s} s"
            )
        self._last_reclaim = self.clock()

    def agent_stopped(self) -> None:
        """An agent's task ended: its frozen objects are garbage the next reclaim frees."""
        self._stopped = True

    def step(self) -> HeapStep:
        """One turn: a reclaim if an agent stopped or one is due, a freeze otherwise."""
        now = self.clock()
        if self._stopped or now - self._last_reclaim >= self.reclaim_every_s:
            self._stopped = False
            self._last_reclaim = now
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            return HeapStep.RECLAIM
        gc.collect(1)
        gc.freeze()
        return HeapStep.FREEZE

    async def run(self) -> None:
        """Step every ``freeze_every_s`` until cancelled; the heap is left unfrozen."""
        try:
            while True:
                await asyncio.sleep(self.freeze_every_s)
                began = time.perf_counter()
                done = self.step()
                log.debug(
                    "heap kept",
                    extra={
                        "step": done.value,
                        "frozen": gc.get_freeze_count(),
                        "ms": round((time.perf_counter() - began) * 1000, 1),
                    },
                )
        finally:
            gc.unfreeze()
