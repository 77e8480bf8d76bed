"""The sidecar's deployment watch takes an API server's refusal of a watch as an error to
retry, not as events.

An overloaded API server (its priority and fairness queues full) answers a watch 429 with
a plain-text body; read as a stream, that text failed to parse and the exception ended the
whole sidecar agent (seen at 300 shared replicas on a busy machine: 165 agent restarts).
Over real HTTP (an aiohttp server answering as the API server does) the watcher lists,
meets a 429 watch, retries, and reports the change its next watch carries.

The watcher also hands on only states that differ in what a sidecar acts on: the
operator's writes of replica counts, conditions and its fence reach every sidecar's watch,
and each used to wake every agent for a full pass (8,000 passes per delta at 1,000
replicas).

Would catch: a refused watch's body parsed as events, the refusal raised out of ``run``;
a status-only write waking the agents, or a change of the target, its ``switchAt``, the
rollback record or the spec being skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from hotload.api import API_VERSION, KvCachePolicy, SnapshotKind, SnapshotRef
from hotload.retry import RetryPolicy
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher
from tests.fixtures.watch_stub import serving

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


def target(step: int, switch_at: datetime | None = None) -> dict[str, Any]:
    ref = SnapshotRef(identity=f"policy-{step}", step=step, kind=SnapshotKind.FULL,
                      kv_cache_policy=KvCachePolicy.ALL, switch_at=switch_at)  # fmt: skip
    return ref.model_dump(mode="json", by_alias=True, exclude_none=True)


TARGET = target(5)


PATH = "/apis/hotload.dev/v1alpha1/namespaces/ns/rolloutdeployments"


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP server answering the deployment's list, then one refused watch, then a
    watch carrying one change (then holding the stream open)."""
    calls: list[str] = []

    async def deployments(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        if str(request.query.get("watch", "")).lower() != "true":
            calls.append("list")
            body = {"metadata": {"resourceVersion": "7"}, "items": [DEPLOYMENT]}
            return web.json_response(body)
        calls.append("watch")
        if calls.count("watch") == 1:
            return web.Response(status=429, text="Too many requests, please try again later.\n")
        stream = web.StreamResponse()
        await stream.prepare(request)
        changed = {
            **DEPLOYMENT,
            "metadata": {**DEPLOYMENT["metadata"], "resourceVersion": "9"},
            "status": {"targetSnapshot": TARGET},
        }
        await stream.write(b"\n" + json.dumps({"type": "MODIFIED", "object": changed}).encode())
        await stream.write(b"\n")
        await closing.wait()
        return stream

    async with serving(PATH, deployments) as host:
        yield host, calls


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


def version(rv: int, spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {
        **DEPLOYMENT,
        "metadata": {**DEPLOYMENT["metadata"], "resourceVersion": str(rv), "uid": "u1"},
        "spec": spec or DEPLOYMENT["spec"],
        "status": status,
    }


COUNTS = {"replicas": 2, "readyReplicas": 1, "fence": "op-a/1"}
SWITCH = datetime(2026, 11, 27, 8, 0, 0, 250000, tzinfo=UTC)
ROLLBACK = {"fromIdentity": "policy-6", "toIdentity": "policy-5", "at": "2026-11-27T08:00:01Z"}
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("MODIFIED", version(10, targetSnapshot=TARGET, **COUNTS)),  # handed: the target appears
    ("MODIFIED", version(11, targetSnapshot=TARGET, **{**COUNTS, "readyReplicas": 2})),
    ("MODIFIED", version(12, targetSnapshot=TARGET, **{**COUNTS, "fence": "op-b/2"})),
    ("MODIFIED", version(13, targetSnapshot=target(5, SWITCH), **COUNTS)),  # handed: switchAt
    ("MODIFIED", version(14, targetSnapshot=target(5, SWITCH), conditions=[{"type": "Ready"}])),
    ("MODIFIED", version(15, targetSnapshot=target(5, SWITCH), rollback=ROLLBACK)),  # handed
    (
        "MODIFIED",
        version(
            16,
            {**DEPLOYMENT["spec"], "replicas": 3},  # handed: the spec
            targetSnapshot=target(5, SWITCH),
            rollback=ROLLBACK,
        ),
    ),
    ("DELETED", version(17)),  # handed: gone
    ("ADDED", version(18)),  # handed: back, though equal to what was there before the delete
]
HANDED = ["7", "10", "13", "15", "16", "17", "18"]


@pytest.fixture
async def scripted_server() -> AsyncIterator[str]:
    """An HTTP server answering the deployment's list, then one watch carrying SCRIPT."""

    async def deployments(request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        if str(request.query.get("watch", "")).lower() != "true":
            return web.json_response({"metadata": {"resourceVersion": "7"}, "items": [DEPLOYMENT]})
        stream = web.StreamResponse()
        await stream.prepare(request)
        for kind, obj in SCRIPT:
            await stream.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        await closing.wait()
        return stream

    async with serving(PATH, deployments) as host:
        yield host


async def test_only_changes_a_sidecar_acts_on_are_handed_on(scripted_server: str) -> None:
    configuration = Configuration()
    configuration.host = scripted_server
    seen: list[DeploymentView] = []
    async with ApiClient(configuration) as api:
        watcher = DeploymentWatcher(api, "ns", NAME, RetryPolicy(), seen.append)
        running = asyncio.create_task(watcher.run())
        try:
            for _ in range(200):
                if any(view.resource_version == "18" for view in seen) or running.done():
                    break
                await asyncio.sleep(0.05)
            assert not running.done(), running
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    assert [view.resource_version for view in seen] == HANDED
    assert watcher.unchanged == len(SCRIPT) + 1 - len(HANDED)
    committed = seen[2].deployment
    assert committed is not None and committed.status is not None
    assert committed.status.target_snapshot is not None
    assert committed.status.target_snapshot.switch_at == SWITCH
    assert seen[5].deployment is None
