"""Retries with exponential backoff and full jitter, for transient storage errors only.

Only :class:`~hotload.errors.StorageUnavailable` is retried here: ``NotFound`` is
transient for the *sidecar* (replication may deliver files late) but retrying it inside
one call would only delay the answer, so the caller's plan loop owns that retry;
``AccessDenied`` never gets better. Sleeps go through ``asyncio.sleep`` so tests can
fast-forward them with ``looptime``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from hotload.errors import StorageUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a storage call that failed transiently."""

    attempts: int = 6
    """Tries in all (1 = no retry)."""
    base_delay: float = 0.2
    """Delay ceiling before the first retry, in seconds; doubles each time."""
    max_delay: float = 10.0
    """Cap of the delay ceiling."""
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    """Source of jitter (seed it in tests)."""

    def delay(self, retry: int) -> float:
        """Full jitter: uniform in [0, min(max_delay, base_delay * 2**retry)]."""
        ceiling = min(self.max_delay, self.base_delay * (2**retry))
        return self.rng.uniform(0.0, ceiling)


NO_RETRY = RetryPolicy(attempts=1)


async def call_with_retry(
    operation: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    what: str,
    on_retry: Callable[[StorageUnavailable, int], None] | None = None,
) -> T:
    """Run ``operation`` until it succeeds, raises a non-retryable error, or attempts run out.

    ``on_retry(err, attempt)`` is called before each wait (for metrics); the last
    ``StorageUnavailable`` is raised when every attempt failed.
    """
    attempt = 0
    while True:
        try:
            return await operation()
        except StorageUnavailable as err:
            attempt += 1
            if attempt >= policy.attempts:
                raise
            wait = policy.delay(attempt - 1)
            log.warning(
                "storage call failed, retrying",
                extra={
                    "operation": what,
                    "attempt": attempt,
                    "wait_s": round(wait, 3),
                    "error": str(err),
                },
            )
            if on_retry is not None:
                on_retry(err, attempt)
            await asyncio.sleep(wait)
