"""A publisher that falls behind publishes the newest step, never holding the trainer.

The trainer can be faster than the links: a Full of a large policy takes several step
intervals to cross a WAN, and a publish queued behind it would be stale before it left.
Blocking the training loop until there is room (what a bounded queue does) costs the
trainer the link's time at every step. So the publisher's queue keeps at most
``max_pending`` publishes waiting; a publish that finds it full takes the place of the
oldest waiting one instead of waiting for room: that older step is *skipped*. Its weights
(the host copy) are dropped at once, its handle resolves to the result of the snapshot
that replaced it (whose ``skipped_steps`` name it), and a Full asked for on it carries
over to its replacement.

Skipping never breaks a chain: the newest step is encoded against the last snapshot the
publisher *published* (its weights are kept in the work directory), so it is a direct
delta from the snapshot every region has or has queued in order (or a Full, when the
cadence or a request says so). What waits is never partly done: the worker takes a job
off the queue before it starts it, and a running publish is never skipped.

:class:`JobQueue` is the worker's queue (:mod:`hotload.publish.worker`); jobs that may be
skipped carry a :class:`Supersedable` tag (:class:`PendingPublish` for a publish), other
jobs (a ``flush``) are never skipped and, when the queue is full of them, the caller
waits as before.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from hotload.publish.weights import CapturedWeights

Work = Callable[[], Coroutine[Any, Any, Any]]


class Supersedable(Protocol):
    """A queued job that a newer one may replace."""

    def absorb(self, older: Supersedable) -> None:
        """Take over what must survive of ``older`` (its step, a Full asked for)."""


@dataclass
class PendingPublish:
    """A publish waiting for the worker: the step, its host copy, what it replaced."""

    step: int
    captured: CapturedWeights | None
    full: bool
    skipped_steps: list[int] = field(default_factory=list)
    """Older steps this publish replaced (oldest first): never published."""

    def absorb(self, older: Supersedable) -> None:
        if not isinstance(older, PendingPublish):
            raise TypeError("a publish replaces only an older publish")
        self.skipped_steps[:0] = [*older.skipped_steps, older.step]
        self.full = self.full or older.full
        older.captured = None  # the host copy goes now, not when the queue moves


@dataclass
class _Entry:
    future: Future[Any]
    work: Work
    tag: Supersedable | None


class QueueClosed(Exception):
    """Put after close."""


class JobQueue:
    """The worker's queue: FIFO, at most ``max_pending`` waiting (see the module doc)."""

    def __init__(self, max_pending: int) -> None:
        self._max_pending = max_pending
        self._entries: deque[_Entry] = deque()
        self._closed = False
        self._cond = threading.Condition()
        self.skipped = 0
        """Jobs replaced by newer ones since the start."""

    def put(self, work: Work, tag: Supersedable | None = None) -> Future[Any]:
        """Queue ``work``; its future holds the outcome.

        With a ``tag``, a full queue drops its oldest tagged entry instead of waiting:
        the new tag absorbs it and the dropped entry's future gets the new one's outcome.
        Without one (or with no tagged entry to drop) it waits for room.
        """
        future: Future[Any] = Future()
        dropped: _Entry | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise QueueClosed
                if len(self._entries) < self._max_pending:
                    break
                if tag is not None:
                    dropped = next((e for e in self._entries if e.tag is not None), None)
                    if dropped is not None:
                        self._entries.remove(dropped)
                        assert dropped.tag is not None
                        tag.absorb(dropped.tag)
                        self.skipped += 1
                        break
                self._cond.wait()
            self._entries.append(_Entry(future, work, tag))
            self._cond.notify_all()
        if dropped is not None:
            _forward(future, dropped.future)
        return future

    def get(self) -> tuple[Future[Any], Work] | None:
        """The oldest entry (waits for one); None once closed and empty."""
        with self._cond:
            while not self._entries and not self._closed:
                self._cond.wait()
            if not self._entries:
                return None
            entry = self._entries.popleft()
            self._cond.notify_all()
            return entry.future, entry.work

    def close(self) -> None:
        """No more puts; ``get`` drains what is queued, then returns None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _forward(source: Future[Any], target: Future[Any]) -> None:
    """``target`` ends as ``source`` does (a skipped publish's handle gets its
    replacement's result)."""

    def copy(done: Future[Any]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif (error := done.exception()) is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
