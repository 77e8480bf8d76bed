"""The one wait loop: the probe's value when it holds, its last value at the deadline, and
a last probe at the deadline, never later (async on the loop's clock, here a fake one)."""

from __future__ import annotations

import asyncio
import time

import pytest

from hotload.waiting import wait_until, wait_until_async


def test_returns_the_probes_value_once_it_holds() -> None:
    answers = iter([None, None, "ready"])
    assert wait_until(lambda: next(answers), 5.0, interval_s=0.001) == "ready"


def test_returns_the_last_falsy_value_at_the_deadline() -> None:
    calls: list[float] = []

    def never() -> int:
        calls.append(time.monotonic())
        return 0

    started = time.monotonic()
    assert wait_until(never, 0.2, interval_s=0.05) == 0
    assert calls[-1] - started >= 0.2  # probed once more at the deadline
    assert 3 <= len(calls) <= 6


def test_a_probe_may_stop_the_wait_by_raising() -> None:
    def exited() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until(exited, 5.0)


@pytest.mark.looptime
async def test_async_waits_on_the_loops_clock() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    probes: list[float] = []

    async def held_after_ten_seconds() -> bool:
        probes.append(loop.time() - started)
        return loop.time() - started >= 10.0

    assert await wait_until_async(held_after_ten_seconds, 60.0, interval_s=1.0) is True
    assert probes[0] == 0.0
    assert probes[-1] == pytest.approx(10.0)


@pytest.mark.looptime
async def test_async_gives_up_at_the_deadline_not_after() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    probes: list[float] = []

    async def never() -> None:
        probes.append(loop.time() - started)

    assert await wait_until_async(never, 2.5, interval_s=1.0) is None
    assert probes == pytest.approx([0.0, 1.0, 2.0, 2.5])


@pytest.mark.looptime
async def test_async_intervals_grow_up_to_their_cap() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    seen: list[float] = []

    async def probe() -> bool:
        seen.append(round(loop.time() - start, 6))
        return False

    await wait_until_async(probe, 10.0, interval_s=1.0, growth=2.0, max_interval_s=3.0)
    assert seen == [0.0, 1.0, 3.0, 6.0, 9.0, 10.0]
