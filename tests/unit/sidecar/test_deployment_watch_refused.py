"""The sidecar's deployment watch takes an API server's refusal of a watch as an error to
retry, not as events.

An overloaded API server (its priority and fairness queues full) answers a watch 429 with
a plain-text body; read as a stream, that text failed to parse and the exception ended the
whole sidecar agent (seen at 300 shared replicas on a busy machine: 165 agent restarts).
Over real HTTP (an aiohttp server answering as the API server does) the watcher lists,
meets a 429 watch, retries, and reports the change its next watch carries.

Would catch: a refused watch's body parsed as events, the refusal raised out of ``run``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from hotload.api import API_VERSION
from hotload.retry import RetryPolicy
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher

NAME = "fleet"
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": "RolloutDeployment",
    "metadata": {"name": NAME, "namespace": "ns", "resourceVersion": "7"},
    "spec": {
        "model": {"name": "tiny", "servedName": "policy"},
        "engine": {"kind": "noop", "port": 8000},
        "replicas": 1,
        "hotLoad": {"bucketUrl": "file:///tmp/bucket", "transition": "ASYNC"},
    },
}


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP server answering the deployment's list, then one refused watch, then a
    watch carrying one change (then holding the stream open)."""
    calls: list[str] = []

    async def deployments(request: web.Request) -> web.StreamResponse:
        if str(request.query.get("watch", "")).lower() != "true":
            calls.append("list")
            body = {"metadata": {"resourceVersion": "7"}, "items": [DEPLOYMENT]}
            return web.json_response(body)
        calls.append("watch")
        if calls.count("watch") == 1:
            return web.Response(status=429, text="Too many requests, please try again later.\n")
        stream = web.StreamResponse()
        await stream.prepare(request)
        changed = {**DEPLOYMENT, "metadata": {**DEPLOYMENT["metadata"], "resourceVersion": "9"}}
        await stream.write(b"\n" + json.dumps({"type": "MODIFIED", "object": changed}).encode())
        await stream.write(b"\n")
        await asyncio.sleep(30)
        return stream

    app = web.Application()
    app.router.add_get("/apis/hotload.dev/v1alpha1/namespaces/ns/rolloutdeployments", deployments)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


async def test_a_refused_watch_is_retried_and_the_next_one_delivers(
    api_server: tuple[str, list[str]],
) -> None:
    host, calls = api_server
    configuration = Configuration()
    configuration.host = host
    seen: list[DeploymentView] = []
    async with ApiClient(configuration) as api:
        watcher = DeploymentWatcher(
            api, "ns", NAME, RetryPolicy(initial_s=0.05, maximum_s=0.1), seen.append
        )
        running = asyncio.create_task(watcher.run())
        try:
            for _ in range(200):
                if any(view.resource_version == "9" for view in seen) or running.done():
                    break
                await asyncio.sleep(0.05)
            assert not running.done(), "the watcher ended on the refusal"
            assert [view.resource_version for view in seen][-1] == "9", (calls, seen)
            assert calls[:3] == ["list", "watch", "list"], calls
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
