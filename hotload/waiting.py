"""The one wait-until-deadline loop: poll a probe until it holds or the time is up.

A leaf like :mod:`hotload.errors` (it imports nothing of ours), used by the code, the
tests and the benchmarks alike, so every wait on a condition has the same shape: the
probe runs first, then at least every ``interval_s`` and once more at the deadline
(never later), and the caller decides what a timeout means — usually raising its own
typed error that names what it waited for. A probe may raise to stop the wait early (a
process that exited while it was awaited).

The probe's last value is returned: truthy when the condition held, falsy at the
deadline (so a caller can say what it saw last). The async variant keeps time on the
running loop's clock, so tests on a fake clock (``looptime``) wait no real time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.1


def wait_until(
    probe: Callable[[], T], timeout_s: float, *, interval_s: float = DEFAULT_INTERVAL_S
) -> T:
    """Call ``probe`` until it returns something truthy, or ``timeout_s`` seconds pass.

    Returns the probe's last value: truthy if it held, falsy at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return result
        time.sleep(min(interval_s, remaining))


async def wait_until_async(
    probe: Callable[[], Awaitable[T]],
    timeout_s: float,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    growth: float = 1.0,
    max_interval_s: float | None = None,
) -> T:
    """Await ``probe()`` until it returns something truthy, or ``timeout_s`` seconds pass.

    Returns the probe's last value: truthy if it held, falsy at the deadline. Time is the
    running loop's (``loop.time()``). ``growth`` > 1 lengthens the interval after each
    probe, up to ``max_interval_s`` (a wait that is usually short, sometimes long).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    interval = interval_s
    while True:
        result = await probe()
        if result:
            return result
        remaining = deadline - loop.time()
        if remaining <= 0:
            return result
        await asyncio.sleep(min(interval, remaining))
        interval *= growth
        if max_interval_s is not None:
            interval = min(interval, max_interval_s)
