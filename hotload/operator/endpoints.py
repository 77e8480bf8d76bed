"""``/healthz`` and ``/metrics`` on ``$POD_IP:8080`` (all interfaces when unset).

``/healthz`` answers while the operator's event loop turns (a wedged loop cannot answer,
so the liveness probe restarts it); it reports how many deployments this replica
reconciles (0 on a standby) and whether it leads, without failing a standby. ``/metrics`` serves the
operator's own registry in Prometheus' text format.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hotload.operator.metrics import OperatorMetrics


async def start_endpoints(
    host: str,
    port: int,
    metrics: OperatorMetrics,
    reconciling: Callable[[], int],
    leading: Callable[[], bool] = lambda: True,
) -> web.AppRunner:
    """Serve the endpoints; the caller stops them with ``await runner.cleanup()``."""

    async def healthz(request: web.Request) -> web.Response:
        body = {"status": "ok", "reconciling": reconciling(), "leader": leading()}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def metrics_page(request: web.Request) -> web.Response:
        payload = generate_latest(metrics.registry)
        response = web.Response(body=payload)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host or None, port)
    await site.start()
    return runner
