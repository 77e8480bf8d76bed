"""A report write the API server refuses with 429 is retried after at least a second,
without reading the Pod back.

Priority and fairness answers 429 to a request it did not process: the Pod is as the
writer last saw it. At 1,000 replicas each refusal was followed by a GET (one more
request to a server that had just said it had no room) and a retry 0.3 s later: ~1,900
GETs and ~2,900 refused writes per rollout (bench/propagation). Over real HTTP (a stub
answering as the API server does), the writer reads its Pod once at start, meets two
429s, and lands its report on the third write.

Would catch: a read-back after a 429, a retry sooner than the throttled wait, the report
lost after refusals, a read-back no longer done after an error of unknown outcome (500).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from hotload.api import LoadPath, ReplicaState
from hotload.retry import RetryPolicy
from hotload.sidecar import pod_writer
from hotload.sidecar.pod_report import PodAnnotations, readiness_gate
from hotload.sidecar.pod_writer import PodWriter
from tests.fixtures.watch_stub import serving_routes

PODS = "/api/v1/namespaces/ns/pods"
WAIT_S = 0.2
READY = PodAnnotations("s-5", "s-5", ReplicaState.READY, datetime(2026, 11, 27, tzinfo=UTC),
                       LoadPath.DELTA)  # fmt: skip


def status(code: int, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "message": message}  # fmt: skip
    return web.json_response(body, status=code)


@pytest.mark.parametrize(("refusal", "reads_back"), [(429, False), (500, True)])
async def test_a_refused_report_is_written_again_without_a_read(
    refusal: int, reads_back: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pod_writer, "THROTTLED_WAIT_S", WAIT_S)
    pod: dict[str, Any] = {"metadata": {"name": "demo-0", "namespace": "ns", "uid": "u1",
                                        "resourceVersion": "5", "annotations": {}}}  # fmt: skip
    calls: list[tuple[str, float]] = []

    async def watch(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        stream = web.StreamResponse()
        await stream.prepare(request)
        await closing.wait()
        return stream

    async def read(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        calls.append(("GET", time.monotonic()))
        return web.json_response(pod)

    async def patch(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        calls.append(("PATCH", time.monotonic()))
        if sum(1 for call, _ in calls if call == "PATCH") <= 2:
            return status(refusal, "Too many requests, please try again later.")
        body = json.loads(await request.read())
        annotations = body.get("metadata", {}).get("annotations", {})
        kept = {**pod["metadata"]["annotations"], **annotations}
        pod["metadata"]["annotations"] = {k: v for k, v in kept.items() if v is not None}
        pod["metadata"]["resourceVersion"] = "6"
        return web.json_response(pod)

    routes = [("GET", PODS, watch), ("GET", f"{PODS}/demo-0", read),
              ("PATCH", f"{PODS}/demo-0/status", patch)]  # fmt: skip
    async with serving_routes(routes) as host:
        configuration = Configuration()
        configuration.host = host
        async with ApiClient(configuration) as api:
            writer = PodWriter(api, "ns", "demo-0", RetryPolicy(initial_s=0.01, maximum_s=0.02))
            assert await writer.observe_at_start(lambda attempt: 0.01) is not None
            running = asyncio.create_task(writer.run())
            try:
                writer.publish(READY, readiness_gate(None, None, 5, None))
                await asyncio.wait_for(writer.settled(), timeout=10)
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
    kinds = [call for call, _ in calls]
    if reads_back:
        assert kinds == ["GET", "PATCH", "GET", "PATCH", "GET", "PATCH"]
    else:
        assert kinds == ["GET", "PATCH", "PATCH", "PATCH"]
        patches = [moment for call, moment in calls if call == "PATCH"]
        assert min(b - a for a, b in itertools.pairwise(patches)) >= WAIT_S
    assert pod["metadata"]["annotations"] == {k: v for k, v in READY.values().items() if v}
    assert writer.patches == 1 and writer.reads == (3 if reads_back else 1)
