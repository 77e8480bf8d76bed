"""Retries of storage calls, for transient storage errors only, with full jitter.

Only :class:`~hotload.errors.StorageUnavailable` is retried here: ``NotFound`` is
transient for the *sidecar* (replication may deliver files late) but retrying it inside
one call would only delay the answer, so the caller's plan loop owns that retry;
``AccessDenied`` never gets better. Delays come from the one
:class:`~hotload.retry.Backoff`; sleeps go through ``asyncio.sleep`` so tests can
fast-forward them with ``looptime``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from hotload.errors import StorageUnavailable
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)
T = TypeVar("T")

STORAGE_RETRY = RetryPolicy(initial_s=0.2, maximum_s=10.0, jitter=1.0, attempts=6)
"""A storage call's default: 6 tries, full jitter under a ceiling of 0.2 s doubling to 10 s."""


async def call_with_retry(
    operation: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    what: str,
    on_retry: Callable[[StorageUnavailable, int], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Run ``operation`` until it succeeds, raises a non-retryable error, or attempts run out.

    ``on_retry(err, attempt)`` is called before each wait (for metrics); the last
    ``StorageUnavailable`` is raised when every attempt failed. ``rng`` draws the jitter
    (seed it in tests).
    """
    backoff = Backoff(policy, rng)
    attempt = 0
    while True:
        try:
            return await operation()
        except StorageUnavailable as err:
            attempt += 1
            if not policy.allows(attempt):
                raise
            wait = backoff.next_delay()
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
