"""Coalesce wake-ups into few reconciles: kopf has no batching, so we keep our own.

A thousand replicas reporting within a second must become a handful of status writes,
not a thousand. Every watch event pokes its deployment's reconciler; the reconciler
waits for the first poke, then lets a short window pass so that everything arriving in
it is handled by one reconcile. A poke that matters for latency (a new PolicySnapshot,
a spec change) is *urgent* and shortens the window to a few milliseconds: the target
moves as soon as a snapshot is applied, while pod reports are batched.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchWindows:
    routine_s: float = 0.5
    """How long pod reports are gathered before one reconcile handles them all."""
    urgent_s: float = 0.02
    """How long after an urgent poke (a snapshot applied, a spec changed) it reconciles."""


class Wakeup:
    """A coalescing wake-up: ``poke`` from handlers, ``wait`` in the reconcile loop."""

    def __init__(self, windows: BatchWindows) -> None:
        self._windows = windows
        self._poked = asyncio.Event()
        self._sooner = asyncio.Event()
        self._due: float | None = None
        self.pokes = 0

    def poke(self, *, urgent: bool = False) -> None:
        """Ask for a reconcile within the routine (or urgent) window from now."""
        self.pokes += 1
        now = asyncio.get_running_loop().time()
        due = now + (self._windows.urgent_s if urgent else self._windows.routine_s)
        if self._due is None or due < self._due:
            self._due = due
            self._sooner.set()
        self._poked.set()

    def poke_later(self, delay_s: float) -> None:
        """Ask for a reconcile ``delay_s`` from now (a deferred write comes due)."""
        asyncio.get_running_loop().call_later(delay_s, self.poke)

    async def wait(self, timeout_s: float) -> bool:
        """Wait for pokes and let their window pass; False when ``timeout_s`` passed unpoked."""
        try:
            await asyncio.wait_for(self._poked.wait(), timeout_s)
        except TimeoutError:
            return False
        loop = asyncio.get_running_loop()
        while self._due is not None and (remaining := self._due - loop.time()) > 0:
            self._sooner.clear()
            try:
                await asyncio.wait_for(self._sooner.wait(), remaining)
            except TimeoutError:
                break
        self._poked.clear()
        self._due = None
        return True
