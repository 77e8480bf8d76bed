"""The publisher's worker: one thread with its own event loop that runs the queued jobs
(publishes, flushes) one at a time, in the order they were queued.

The queue (:class:`hotload.publish.newest.JobQueue`) holds at most ``max_pending`` jobs
besides the running one. A publish that finds it full replaces the oldest waiting
publish (the newest step goes out, the stale one is skipped: :mod:`hotload.publish.newest`),
so the trainer never waits for a link; any other job waits for room.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from hotload.publish.newest import JobQueue, Supersedable

log = logging.getLogger(__name__)

T = TypeVar("T")


class SerialWorker:
    """Runs coroutines one after the other on a thread of its own."""

    def __init__(
        self,
        *,
        max_pending: int,
        name: str,
        finish: Callable[[], Awaitable[None]],
    ) -> None:
        """``finish`` runs on the worker's loop after the last job (e.g. closing clients
        that belong to that loop)."""
        self._queue = JobQueue(max_pending)
        self._finish = finish
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def skipped(self) -> int:
        """Publishes replaced by newer ones so far."""
        return self._queue.skipped

    def submit(
        self, work: Callable[[], Coroutine[Any, Any, T]], tag: Supersedable | None = None
    ) -> Future[T]:
        """Queue ``work``; its future holds the outcome. With a ``tag`` a full queue
        drops its oldest tagged job for this one (whose future then gets this outcome);
        without one, a full queue blocks the caller until there is room."""
        return self._queue.put(work, tag)

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        self._queue.close()
        self._thread.join()

    def _work(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while True:
                job = self._queue.get()
                if job is None:
                    break
                future, work = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(loop.run_until_complete(work()))
                except BaseException as err:  # handed to the caller through the future
                    log.error("publish failed", extra={"error": str(err)[:500]})
                    future.set_exception(err)
        finally:
            loop.run_until_complete(self._finish())
            loop.close()
