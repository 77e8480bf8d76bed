"""Backoff with full jitter, and which errors are retried (on a fake loop clock)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from hotload.errors import AccessDenied, NotFound, StorageUnavailable
from hotload.storage import RetryPolicy
from hotload.storage.retry import STORAGE_RETRY, call_with_retry


def test_delays_stay_within_the_doubling_ceiling_and_the_cap() -> None:
    policy = RetryPolicy(attempts=10, initial_s=0.5, maximum_s=3.0, jitter=1.0)
    rng = random.Random(7)
    for retry in range(10):
        ceiling = min(3.0, 0.5 * 2**retry)
        samples = [policy.delay(retry, rng) for _ in range(200)]
        assert all(0.0 <= sample <= ceiling for sample in samples)
        assert max(samples) > ceiling * 0.8  # jitter spreads over the whole range


@pytest.mark.looptime
async def test_transient_failures_are_retried_until_success() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise StorageUnavailable("down", key="k")
        return "ok"

    retries: list[int] = []
    policy = RetryPolicy(attempts=5, initial_s=1.0, maximum_s=8.0, jitter=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await call_with_retry(
        flaky, policy, what="test", on_retry=lambda _, n: retries.append(n), rng=random.Random(1)
    )
    assert result == "ok"
    assert calls == 4
    assert retries == [1, 2, 3]
    assert (
        0.0 < loop.time() - started <= 1.0 + 2.0 + 4.0
    )  # slept on the fake clock, within ceilings


@pytest.mark.looptime
async def test_last_transient_error_is_raised_when_attempts_run_out() -> None:
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise StorageUnavailable("down", attempt=calls)

    with pytest.raises(StorageUnavailable) as raised:
        await call_with_retry(
            down, replace(STORAGE_RETRY, attempts=3), what="test", rng=random.Random(2)
        )
    assert calls == 3
    assert raised.value.context["attempt"] == 3


@pytest.mark.parametrize("error", [NotFound("missing"), AccessDenied("denied")])
async def test_not_found_and_access_denied_are_not_retried(error: Exception) -> None:
    calls = 0

    async def fail() -> None:
        nonlocal calls
        calls += 1
        raise error

    with pytest.raises(type(error)):
        await call_with_retry(fail, RetryPolicy(attempts=5), what="test")
    assert calls == 1
