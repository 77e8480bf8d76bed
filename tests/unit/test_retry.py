"""Retries back off exponentially, capped, with jitter so a fleet does not retry in step."""

from __future__ import annotations

import random

import pytest

from hotload.retry import Backoff, RetryPolicy


def test_delays_grow_then_stay_under_the_cap() -> None:
    policy = RetryPolicy(initial_s=1.0, maximum_s=8.0, multiplier=2.0, jitter=0.0)
    backoff = Backoff(policy)
    assert [backoff.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_jitter_stays_within_its_fraction_and_varies() -> None:
    policy = RetryPolicy(initial_s=4.0, maximum_s=4.0, jitter=0.5)
    backoff = Backoff(policy, random.Random(7))
    delays = [backoff.next_delay() for _ in range(50)]
    assert all(2.0 <= d <= 4.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 40


def test_reset_starts_over() -> None:
    backoff = Backoff(RetryPolicy(initial_s=1.0, jitter=0.0))
    backoff.next_delay()
    backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_a_backoff_that_never_retries_seeds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backoff is made per storage read; seeding reads the OS's entropy (~1.5 % of a
    1,000-agent host in a rollout), so only a retry may seed one."""
    made: list[random.Random] = []

    class Counting(random.Random):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr("hotload.retry.random.Random", Counting)
    backoff = Backoff(RetryPolicy(initial_s=1.0, jitter=0.5))
    backoff.reset()
    assert made == []
    assert 0.5 <= backoff.next_delay() <= 1.0
    assert 1.0 <= backoff.next_delay() <= 2.0
    assert len(made) == 1
