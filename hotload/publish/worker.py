"""The publisher's worker: one thread with its own event loop that runs the queued jobs
(publishes, flushes) one at a time, in the order they were queued.

The queue holds at most ``max_pending`` jobs besides the running one; a caller that
queues more waits for room (the trainer is faster than the links), and that wait counts
as its blocked time.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_Job = tuple["Future[Any]", Callable[[], Coroutine[Any, Any, Any]]]


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
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_pending)
        self._finish = finish
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """Queue ``work`` (blocks while the queue is full); its future holds the outcome."""
        future: Future[T] = Future()
        self._queue.put((future, work))
        return future

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        self._queue.put(None)
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
