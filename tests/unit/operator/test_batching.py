"""Coalescing wake-ups on a fake loop clock (looptime): bursts become one reconcile."""

from __future__ import annotations

import asyncio

import pytest

from hotload.operator.batching import BatchWindows, Wakeup

WINDOWS = BatchWindows(routine_s=0.5, urgent_s=0.02)


async def _burst(wakeup: Wakeup, count: int, every_s: float) -> None:
    for _ in range(count):
        wakeup.poke()
        await asyncio.sleep(every_s)


@pytest.mark.looptime
async def test_a_burst_of_reports_is_one_wakeup_after_the_window() -> None:
    wakeup = Wakeup(WINDOWS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    burster = asyncio.create_task(_burst(wakeup, 800, 0.001))  # 0.8 s of reports
    assert await wakeup.wait(timeout_s=30)
    assert loop.time() - started == pytest.approx(0.5, abs=0.01)
    # What came after the first window is one more wake-up, a window after its first poke.
    assert await wakeup.wait(timeout_s=30)
    assert loop.time() - started == pytest.approx(1.0, abs=0.01)
    await burster
    assert await wakeup.wait(timeout_s=30) is False


@pytest.mark.looptime
async def test_an_urgent_poke_cuts_the_window_short() -> None:
    wakeup = Wakeup(WINDOWS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    wakeup.poke()
    loop.call_later(0.1, lambda: wakeup.poke(urgent=True))
    assert await wakeup.wait(timeout_s=30)
    assert loop.time() - started == pytest.approx(0.12, abs=0.005)


@pytest.mark.looptime
async def test_without_pokes_it_times_out_for_the_periodic_resync() -> None:
    wakeup = Wakeup(WINDOWS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await wakeup.wait(timeout_s=30) is False
    assert loop.time() - started == pytest.approx(30)


@pytest.mark.looptime
async def test_poke_later_wakes_it_when_a_deferred_write_comes_due() -> None:
    wakeup = Wakeup(WINDOWS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    wakeup.poke_later(2.0)
    assert await wakeup.wait(timeout_s=30)
    assert loop.time() - started == pytest.approx(2.5, abs=0.01)
