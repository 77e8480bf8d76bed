"""The one retry policy and backoff: exponential delays with jitter, for every layer.

A leaf like :mod:`hotload.errors` (it imports nothing of ours), so storage, the sidecar,
the pod runtime and the CLI share one formula instead of each doubling its own delay.
Retry ``n`` (0 = the first) waits ``min(maximum_s, initial_s * multiplier**n)`` — the
*ceiling* — of which ``jitter`` is drawn at random: ``ceiling * (1 - jitter)`` plus a
uniform part in ``[0, ceiling * jitter]``. ``jitter=1`` is "full jitter" (a fleet of
replicas that all miss the same object must not retry in lockstep); ``jitter=0`` is
a fixed doubling (the pod runtime's kubelet-like restarts). Sleeps go through
``asyncio.sleep``, so tests fast-forward them on a fake loop clock (``looptime``).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How patiently to retry: the delay ceilings, their jitter, and how many tries.

    The defaults are the sidecar's retries of a whole load (0.5 s doubling to 30 s, half
    of each delay random, no limit on tries); each user that needs others names them.
    """

    initial_s: float = 0.5
    """Delay ceiling before the first retry, in seconds."""
    maximum_s: float = 30.0
    """Cap of the delay ceiling."""
    multiplier: float = 2.0
    """Growth of the ceiling per retry."""
    jitter: float = 0.5
    """Fraction of each delay drawn at random (0: fixed delays, 1: full jitter)."""
    attempts: int | None = None
    """Tries in all, the first included (1 = no retry); None: retry until told to stop."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], not {self.jitter}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")

    def ceiling(self, retry: int) -> float:
        """The largest delay before retry number ``retry`` (0 = the first retry)."""
        return float(min(self.maximum_s, self.initial_s * self.multiplier**retry))

    def delay(self, retry: int, rng: random.Random) -> float:
        """The delay before retry number ``retry``: the ceiling, ``jitter`` of it random."""
        ceiling = self.ceiling(retry)
        fixed = ceiling * (1.0 - self.jitter)
        return fixed + rng.uniform(0.0, ceiling * self.jitter)

    def allows(self, tries: int) -> bool:
        """Whether another try may follow ``tries`` failed ones."""
        return self.attempts is None or tries < self.attempts


NO_RETRY = RetryPolicy(attempts=1)
"""One try, no retry."""


class Backoff:
    """The delays of one run of retries under a policy; :meth:`reset` after a success."""

    def __init__(self, policy: RetryPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.attempts = 0
        """Delays handed out since the last reset (the retries so far)."""
        self._rng = rng

    def next_delay(self) -> float:
        """The delay before the next attempt (and count this attempt)."""
        if self._rng is None:
            # Made on the first retry, not with the backoff: seeding reads the OS's entropy,
            # and most calls (a storage read, one per file) succeed without one.
            self._rng = random.Random()
        delay = self.policy.delay(self.attempts, self._rng)
        self.attempts += 1
        return delay

    async def wait(self) -> float:
        """Sleep the next delay; returns it (for logs)."""
        delay = self.next_delay()
        await asyncio.sleep(delay)
        return delay

    def reset(self) -> None:
        self.attempts = 0
