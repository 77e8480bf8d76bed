"""The shared host's thread pool: the blocking work of the agent started first goes first.

In a cluster each sidecar loads a snapshot on its own pod's cores, so a replica is Ready
as soon as its own work is done, whatever the rest of the fleet does. A shared host runs
a thousand agents' loads on one machine: with a plain FIFO pool each load's steps (read a
manifest, hash a file, rebuild, …) queue behind every other agent's step of the same kind,
so every replica finishes together at the end, and the first report waits for the whole
fleet's work. Here each blocking call carries its agent's rank (the order the host started
the agents, set as a context variable that the agent's tasks inherit) and the workers take
the lowest rank first, so the host finishes replicas one after another as separate
machines would: the first within one load's time, the median at half the fleet's. Calls
from outside any agent go first (rank -1). The total work is the same.

The calls of an agent that is building now (:class:`~hotload.local.runtime.urgent_loop.
Urgency`) go before any other agent's, and every answer is set in its caller's context,
so the event loop's wake-up of that caller is urgent too
(:mod:`hotload.local.runtime.urgent_loop`).
"""

from __future__ import annotations

import contextvars
import functools
import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from hotload.local.runtime.urgent_loop import Urgency

T = TypeVar("T")

#: The running agent's rank (its host's start order); unset outside agents.
AGENT_RANK: ContextVar[int] = ContextVar("hotload_agent_rank", default=-1)

_Item = tuple[
    int, int, int, "Future[Any] | None", Callable[[], Any] | None, contextvars.Context | None
]


class RankedExecutor(ThreadPoolExecutor):
    """A fixed pool of threads taking the queued call of the lowest agent rank first.

    A ``ThreadPoolExecutor`` only in name (the event loop takes no other kind as its
    default executor): ``submit`` and ``shutdown`` are its own, so the base class never
    starts a thread."""

    def __init__(self, workers: int, name: str = "ranked", urgency: Urgency | None = None) -> None:
        super().__init__(max_workers=workers, thread_name_prefix=name)
        self._urgency = urgency
        self._heap: list[_Item] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._workers:
            thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            rank = AGENT_RANK.get()
            first = 0 if self._urgency is not None and self._urgency.urgent(rank) else 1
            call = functools.partial(fn, *args, **kwargs)
            context = contextvars.copy_context()
            heapq.heappush(self._heap, (first, rank, next(self._seq), future, call, context))
            self._cond.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel_futures:
                for _, _, _, future, _, _ in self._heap:
                    if future is not None:
                        future.cancel()
                self._heap.clear()
            self._cond.notify_all()
        if wait:
            for thread in self._workers:
                thread.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return
                _, _, _, future, call, context = heapq.heappop(self._heap)
            assert future is not None and call is not None and context is not None
            if not future.set_running_or_notify_cancel():
                continue
            # In the caller's context: the loop schedules the caller's wake-up from here.
            try:
                value = call()
            except BaseException as err:  # handed to the caller through the future
                context.run(future.set_exception, err)
            else:
                context.run(future.set_result, value)
