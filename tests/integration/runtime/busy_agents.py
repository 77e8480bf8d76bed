"""A shared-host agent factory for tests: each agent runs a fixed number of blocking calls
one after another through the host's default executor, then ends (exit 0).

What a sidecar's load does on a shared host (reads, hashes, rebuilds handed to threads),
without the region: the order in which the agents end is the order the host finished
their work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry


async def run(env: Mapping[str, str], registry: CollectorRegistry) -> None:
    """``BUSY_CALLS`` calls of ``BUSY_CALL_S`` seconds each, in turn."""
    del registry
    for _ in range(int(env["BUSY_CALLS"])):
        await asyncio.to_thread(time.sleep, float(env["BUSY_CALL_S"]))
