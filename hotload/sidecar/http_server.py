"""Run the front on uvicorn inside the agent's event loop, on ``$POD_IP:8480``.

uvicorn's ``Server.serve`` would install its own SIGINT/SIGTERM handlers and re-raise the
signal when it stops; the agent is a task that the shell (or the pod runtime) cancels, so
the server here leaves signals alone and stops when its task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator

import httpx
import uvicorn

from hotload.errors import ConfigError
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.front import FrontSource, build_front
from hotload.waiting import wait_until_async

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_front(
    source: FrontSource, client: httpx.AsyncClient, config: AgentConfig, ready: asyncio.Event
) -> None:
    """Serve until cancelled; ``ready`` is set once the socket listens."""
    app = build_front(
        source,
        client,
        max_request_bytes=config.max_request_bytes,
        max_json_depth=config.max_json_depth,
    )
    server = _EmbeddedServer(
        uvicorn.Config(
            app,
            host=config.bind_host,
            port=config.http_port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
    )

    async def started() -> bool:
        return bool(server.started)

    async def announce() -> None:
        await wait_until_async(started, math.inf, interval_s=0.02)
        log.info(
            "sidecar HTTP listening",
            extra={"host": config.bind_host, "port": config.http_port, "pod": config.pod_name},
        )
        ready.set()

    announcer = asyncio.create_task(announce())
    try:
        await server.serve()
    except SystemExit as err:
        raise ConfigError(
            "the sidecar's HTTP server could not start (is the port taken?)",
            host=config.bind_host,
            port=config.http_port,
        ) from err
    finally:
        announcer.cancel()
        if server.started:
            server.should_exit = True
            server.force_exit = True
            with contextlib.suppress(Exception):
                await server.shutdown()
