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
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

#: The running agent's rank (its host's start order); unset outside agents.
AGENT_RANK: ContextVar[int] = ContextVar("hotload_agent_rank", default=-1)

_Item = tuple[int, int, "Future[Any] | None", Callable[[], Any] | None]


class RankedExecutor(ThreadPoolExecutor):
    """A fixed pool of threads taking the queued call of the lowest agent rank first.

    A ``ThreadPoolExecutor`` only in name (the event loop takes no other kind as its
    default executor): ``submit`` and ``shutdown`` are its own, so the base class never
    starts a thread."""

    def __init__(self, workers: int, name: str = "ranked") -> None:
        super().__init__(max_workers=workers, thread_name_prefix=name)
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
            heapq.heappush(
                self._heap,
                (AGENT_RANK.get(), next(self._seq), future, lambda: fn(*args, **kwargs)),
            )
            self._cond.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel_futures:
                for _, _, future, _ in self._heap:
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
                _, _, future, call = heapq.heappop(self._heap)
            assert future is not None and call is not None
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as err:  # handed to the caller through the future
                future.set_exception(err)
