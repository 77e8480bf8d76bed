"""The publisher's queue when the trainer is faster than the links: the newest publish
replaces the oldest waiting one instead of blocking the caller.

Would catch: a full queue blocking a publish (the trainer held for a link), a skipped
step's handle never resolving or resolving to something other than its replacement, a
running job skipped, a Full asked for on a skipped step lost, a skipped host copy kept
alive, a flush (untagged) dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from hotload.publish.newest import JobQueue, PendingPublish, QueueClosed
from hotload.publish.weights import CapturedWeights
from hotload.publish.worker import SerialWorker


def _weights() -> CapturedWeights:
    return CapturedWeights(tensors={"w": object()})


async def _nothing() -> None:
    return None


class Gate:
    """A job that runs until released (the slow link)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    async def __call__(self) -> str:
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        return "first"


def _worker(max_pending: int = 1) -> SerialWorker:
    return SerialWorker(max_pending=max_pending, name="test-worker", finish=_nothing)


def test_a_full_queue_replaces_the_oldest_waiting_publish_without_blocking() -> None:
    worker = _worker()
    gate = Gate()
    running = worker.submit(gate, PendingPublish(0, _weights(), full=False))
    assert gate.started.wait(5)
    ran: list[int] = []
    tags = [PendingPublish(step, _weights(), full=False) for step in (1, 2, 3)]
    futures = []
    began = time.monotonic()
    for tag in tags:

        async def work(tag: PendingPublish = tag) -> int:
            ran.append(tag.step)
            return tag.step

        futures.append(worker.submit(work, tag))
    assert time.monotonic() - began < 0.5  # nobody waited for the running job
    assert worker.skipped == 2
    gate.release.set()
    assert running.result(5) == "first"
    # Steps 1 and 2 never ran; their handles get step 3's outcome.
    assert [f.result(5) for f in futures] == [3, 3, 3]
    assert ran == [3]
    assert tags[2].skipped_steps == [1, 2]
    assert tags[0].captured is None and tags[1].captured is None  # host copies dropped
    assert tags[2].captured is not None
    worker.close()


def test_a_full_asked_for_on_a_skipped_step_carries_over() -> None:
    queue = JobQueue(max_pending=1)
    older = PendingPublish(5, _weights(), full=True)
    newer = PendingPublish(6, _weights(), full=False)
    queue.put(_nothing, older)
    queue.put(_nothing, newer)
    assert (newer.full, newer.skipped_steps) == (True, [5])


def test_an_untagged_job_waits_for_room_and_is_never_replaced() -> None:
    queue = JobQueue(max_pending=1)
    flush = queue.put(_nothing)  # a flush: untagged
    done = threading.Event()

    def publish() -> None:
        queue.put(_nothing, PendingPublish(1, _weights(), full=False))
        done.set()

    thread = threading.Thread(target=publish)
    thread.start()
    assert not done.wait(0.3)  # nothing tagged to replace: the publish waits for room
    taken = queue.get()
    assert taken is not None and taken[0] is flush
    assert done.wait(5)
    thread.join()
    assert queue.skipped == 0


def test_a_failure_of_the_replacement_reaches_the_skipped_handles() -> None:
    worker = _worker()
    gate = Gate()
    worker.submit(gate, PendingPublish(0, _weights(), full=False))
    assert gate.started.wait(5)

    async def fails() -> Any:
        raise RuntimeError("bucket refused")

    skipped = worker.submit(_nothing, PendingPublish(1, _weights(), full=False))
    newest = worker.submit(fails, PendingPublish(2, _weights(), full=False))
    gate.release.set()
    for future in (skipped, newest):
        with pytest.raises(RuntimeError, match="bucket refused"):
            future.result(5)
    worker.close()


def test_puts_after_close_are_refused_and_queued_jobs_still_run() -> None:
    queue = JobQueue(max_pending=2)
    first = queue.put(_nothing, PendingPublish(1, _weights(), full=False))
    queue.close()
    with pytest.raises(QueueClosed):
        queue.put(_nothing)
    taken = queue.get()
    assert taken is not None and taken[0] is first
    assert queue.get() is None
