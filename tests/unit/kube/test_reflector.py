"""The shared reflector's handling of one watch event (pure), and where a watch without a
list starts (over HTTP; the loop runs against real apiservers in the operator, sidecar and
runtime integration tests).

Would catch: a bookmark delivered as a change, an event that does not move the version,
a 410 in the stream taken for an ordinary error (it must list again at once).
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from hotload.errors import KubeError, KubeExpired
from hotload.kube.reflector import ANY_VERSION, Reflector, watch_timeout_for
from hotload.retry import RetryPolicy
from tests.fixtures.watch_stub import serving


def test_the_pod_watch_turns_an_expired_version_into_a_fresh_list() -> None:
    seen: list[tuple[str, str]] = []
    watch = Reflector(
        lambda: None,  # type: ignore[arg-type,return-value]
        "/api/v1/namespaces/ns/pods", lambda items, version: None,
        lambda kind, pod: seen.append((kind, pod["metadata"]["name"])),
    )  # fmt: skip
    pod = {"metadata": {"name": "demo-0", "resourceVersion": "7"}}
    assert watch.handle({"type": "MODIFIED", "object": pod}, "5") == "7"
    assert watch.handle({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
                        "7") == "9"  # fmt: skip
    assert seen == [("MODIFIED", "demo-0")]
    with pytest.raises(KubeExpired):
        watch.handle({"type": "ERROR", "object": {"code": 410, "message": "too old"}}, "9")
    with pytest.raises(KubeError) as raised:
        watch.handle({"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "9")
    assert not isinstance(raised.value, KubeExpired)


def test_a_watch_without_a_list_keeps_no_made_up_version() -> None:
    """The sidecar's own Pod (no list: RBAC grants watch only): an event without a
    resourceVersion must not become the version "None"."""
    seen: list[str] = []
    watch = Reflector(
        lambda: None,  # type: ignore[arg-type,return-value]
        "/api/v1/namespaces/ns/pods", None, lambda kind, pod: seen.append(kind),
        params=[("fieldSelector", "metadata.name=demo-0")], list_first=False,
    )  # fmt: skip
    assert watch.handle({"type": "BOOKMARK", "object": {"metadata": {}}}, None) is None
    pod = {"metadata": {"name": "demo-0", "resourceVersion": "7"}}
    assert watch.handle({"type": "ADDED", "object": pod}, None) == "7"
    assert watch.handle({"type": "DELETED", "object": pod}, "7") == "7"
    assert seen == ["ADDED", "DELETED"]


async def test_a_watch_without_a_list_asks_the_watch_cache_not_for_a_consistent_start() -> None:
    """Over real HTTP: the sidecar's own-Pod watch starts from version 0 ("any": the watch
    cache answers at once), and after a failure starts that way again. An unset version asks
    for a consistent start, which a lagging cache answers after 3 s with ``504 Too large
    resource version``: at 1,000 sidecars, ~10,000 such failed watches per rollout.

    Would catch: a from-now watch without ``resourceVersion=0``, or one that after the
    504 retries with the unset version."""
    queries: list[dict[str, str]] = []

    async def pods(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        queries.append(dict(request.query))
        stream = web.StreamResponse()
        await stream.prepare(request)
        if len(queries) == 1:  # what a lagging watch cache answered a consistent start
            error = {"code": 504, "message": "Timeout: Too large resource version: 9, current: 7"}
            await stream.write(json.dumps({"type": "ERROR", "object": error}).encode() + b"\n")
            return stream
        pod = {"metadata": {"name": "demo-0", "resourceVersion": "7"}}
        await stream.write(json.dumps({"type": "ADDED", "object": pod}).encode() + b"\n")
        await closing.wait()
        return stream

    seen: list[str] = []
    async with serving("/api/v1/namespaces/ns/pods", pods) as host:
        configuration = Configuration()
        configuration.host = host
        async with ApiClient(configuration) as api:
            watch = Reflector(
                lambda: api, "/api/v1/namespaces/ns/pods", None,
                lambda kind, pod: seen.append(f"{kind} {pod['metadata']['resourceVersion']}"),
                params=[("fieldSelector", "metadata.name=demo-0")], list_first=False,
                retry=RetryPolicy(initial_s=0.01, maximum_s=0.05),
            )  # fmt: skip
            running = asyncio.create_task(watch.run())
            try:
                for _ in range(200):
                    if seen or running.done():
                        break
                    await asyncio.sleep(0.02)
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
    assert seen == ["ADDED 7"]
    assert [q.get("resourceVersion") for q in queries] == [ANY_VERSION, ANY_VERSION]
    assert all(q["fieldSelector"] == "metadata.name=demo-0" and q["watch"] == "true"
               for q in queries)  # fmt: skip


async def test_watches_started_together_ask_for_different_timeouts() -> None:
    """Over real HTTP: every watch request asks for its own ``timeoutSeconds`` between the
    minimum and twice it, so a fleet's watches that began in the same minute do not all end
    and open again in the same seconds (at 1,000 sidecars, 2,000 watches every 4 minutes,
    refused with 429 and stalling the rollout they met).

    Would catch: one fixed timeout for every watch, or a draw outside [minimum, 2 x minimum).
    """
    minimum = 240
    timeouts: list[int] = []

    async def pods(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        timeouts.append(int(request.query["timeoutSeconds"]))
        stream = web.StreamResponse()
        await stream.prepare(request)
        return stream  # the server ends the watch at once: it is opened again

    async with serving("/api/v1/namespaces/ns/pods", pods) as host:
        configuration = Configuration()
        configuration.host = host
        async with ApiClient(configuration) as api:
            watches = [
                Reflector(
                    lambda: api,
                    "/api/v1/namespaces/ns/pods",
                    None,
                    lambda kind, pod: None,
                    list_first=False,
                    watch_timeout_s=minimum,
                )
                for _ in range(4)
            ]
            running = [asyncio.create_task(watch.run()) for watch in watches]
            try:
                for _ in range(500):
                    if len(timeouts) >= 40 or any(task.done() for task in running):
                        break
                    await asyncio.sleep(0.01)
            finally:
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
    assert len(timeouts) >= 40
    assert all(minimum <= t < 2 * minimum for t in timeouts), timeouts
    assert len(set(timeouts)) > len(timeouts) // 2, timeouts


def test_a_watch_timeout_spans_the_minimum_to_twice_it() -> None:
    class Fixed(random.Random):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.value = value

        def random(self) -> float:
            return self.value

    assert watch_timeout_for(240, Fixed(0.0)) == 240
    assert watch_timeout_for(240, Fixed(0.5)) == 360
    assert watch_timeout_for(240, Fixed(0.9999)) == 479
