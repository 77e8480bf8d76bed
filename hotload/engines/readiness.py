"""Waiting for an engine to come up: poll its health check until a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hotload.errors import EngineUnavailable

POLL_INTERVAL = 0.2


async def poll_until_healthy(
    health: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    url: str | None,
    interval: float = POLL_INTERVAL,
) -> None:
    """Return once ``health()`` is True; ``EngineUnavailable`` when ``timeout`` s pass first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await health():
            return
        if loop.time() >= deadline:
            raise EngineUnavailable(
                "the engine did not become healthy in time", url=url, timeout=timeout
            )
        await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
