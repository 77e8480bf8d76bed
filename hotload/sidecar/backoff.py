"""Exponential backoff with jitter for transient failures.

A fleet of replicas that all miss the same object (replication still copying it) must
not hammer the bucket in lockstep: each delay is ``min(maximum, initial * multiplier**n)``
with a random part (``jitter`` of it) drawn per agent.
"""

from __future__ import annotations

import asyncio
import random

from hotload.sidecar.config import RetryPolicy


class Backoff:
    """Delays for one run of retries; :meth:`reset` after a success."""

    def __init__(self, policy: RetryPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.attempts = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """The delay before the next attempt (and count this attempt)."""
        policy = self.policy
        ceiling = min(policy.maximum_s, policy.initial_s * policy.multiplier**self.attempts)
        self.attempts += 1
        fixed = ceiling * (1.0 - policy.jitter)
        return fixed + self._rng.uniform(0.0, ceiling * policy.jitter)

    async def wait(self) -> float:
        """Sleep the next delay; returns it (for logs)."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        self.attempts = 0
