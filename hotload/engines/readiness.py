"""Waiting for an engine to come up: poll its health check until a deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from hotload.errors import EngineUnavailable
from hotload.waiting import wait_until_async

POLL_INTERVAL = 0.2


async def poll_until_healthy(
    health: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    url: str | None,
    interval: float = POLL_INTERVAL,
) -> None:
    """Return once ``health()`` is True; ``EngineUnavailable`` when ``timeout`` s pass first."""
    if not await wait_until_async(health, timeout, interval_s=interval):
        raise EngineUnavailable(
            "the engine did not become healthy in time", url=url, timeout=timeout
        )
