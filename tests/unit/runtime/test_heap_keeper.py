"""The shared host's heap keeper: survivors frozen, young garbage freed first, frozen
garbage freed by the reclaim that follows an agent's stop or falls due."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from hotload.local.runtime.heap_keeper import HeapKeeper, HeapStep


class Node:
    """A cyclic object: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """The collector's permanent generation is the process's: leave it as found."""
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.collect()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracked(obj: object) -> bool:
    """Whether a collection can reach ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_a_freeze_takes_survivors_out_of_collections_and_frees_young_garbage_first() -> None:
    keeper = HeapKeeper(freeze_every_s=30, reclaim_every_s=600, clock=Clock())
    survivor = Node()
    garbage = Node()
    dead = weakref.ref(garbage)
    del garbage
    assert keeper.step() is HeapStep.FREEZE
    assert dead() is None, "young cyclic garbage is collected before the freeze"
    assert not tracked(survivor), "a survivor is frozen: no collection walks it"
    assert gc.get_freeze_count() > 0


def test_garbage_frozen_alive_is_freed_by_the_reclaim_after_an_agent_stops() -> None:
    keeper = HeapKeeper(freeze_every_s=30, reclaim_every_s=600, clock=Clock())
    node = Node()
    gone = weakref.ref(node)
    assert keeper.step() is HeapStep.FREEZE
    del node
    gc.collect()
    assert gone() is not None, "frozen: a full collection does not free it"
    keeper.agent_stopped()
    assert keeper.step() is HeapStep.RECLAIM
    assert gone() is None
    assert keeper.step() is HeapStep.FREEZE, "one reclaim per stop, then freezes again"


def test_a_reclaim_falls_due_without_a_stop() -> None:
    clock = Clock()
    keeper = HeapKeeper(freeze_every_s=30, reclaim_every_s=600, clock=clock)
    clock.now += 599
    assert keeper.step() is HeapStep.FREEZE
    clock.now += 1
    assert keeper.step() is HeapStep.RECLAIM
    clock.now += 30
    assert keeper.step() is HeapStep.FREEZE


async def test_run_steps_on_its_timer_and_leaves_the_heap_unfrozen() -> None:
    keeper = HeapKeeper(freeze_every_s=0.01, reclaim_every_s=600)
    survivor = Node()
    task = asyncio.create_task(keeper.run())
    try:
        async with asyncio.timeout(10):
            while tracked(survivor):
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert gc.get_freeze_count() == 0
    assert tracked(survivor)


@pytest.mark.parametrize(("freeze", "reclaim"), [(0, 600), (-1, 600), (30, 10)])
def test_intervals_that_cannot_work_are_refused(freeze: float, reclaim: float) -> None:
    with pytest.raises(ValueError, match="freeze every"):
        HeapKeeper(freeze_every_s=freeze, reclaim_every_s=reclaim)
