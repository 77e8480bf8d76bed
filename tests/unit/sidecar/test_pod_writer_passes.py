"""What the agent's passes cost the pod writer: a wait for a turn to build is not loading
time, and a report published again unchanged is not compared again.

In the local runtime's shared mode, a thousand agents take turns to build on two cores; the
last ones wait most of a rollout. Counted as loading, their quick deltas outlasted the 30 s
hold and wrote ``Loading`` then ``Ready`` (1.35-1.42 writes per replica per delta at 1,000
replicas on a slow day, two in the three-region run) — writes real pods, which build at
once, would not make. Over real HTTP (a stub answering as the API server does): with the
hold's clock running, a "working on a newer target" report is written once its hold is
over; with the clock stopped it is not, however long the wait, and the load's end is the
one write; a failure still goes at once while the clock stands.

Would catch: the wait counted as loading again, a stopped clock that also holds back what
must go at once, or a hold that never resumes; a pass that compares its unchanged report
with the Pod again (every 5 s at every agent), or one that misses a change of the Pod.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from hotload.api import LoadPath, ReplicaState, reasons
from hotload.api.pod import ANNOTATION_STATE
from hotload.retry import RetryPolicy
from hotload.sidecar import pod_writer
from hotload.sidecar.pod_report import PodAnnotations, condition_patch, readiness_gate
from hotload.sidecar.pod_writer import HOLD_SPREAD, PodWriter
from tests.fixtures.watch_stub import serving_routes

PODS = "/api/v1/namespaces/ns/pods"
HOLD_S = 0.2
MOMENT = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
LATER = datetime(2026, 11, 27, 9, 1, tzinfo=UTC)
VERIFIED = readiness_gate(4, "s-4", 4, None)
READY_4 = PodAnnotations("s-4", "s-4", ReplicaState.READY, MOMENT, LoadPath.DELTA)
LOADING_5 = PodAnnotations("s-4", "s-5", ReplicaState.LOADING, LATER, LoadPath.DELTA)
READY_5 = PodAnnotations("s-5", "s-5", ReplicaState.READY, LATER, LoadPath.DELTA)
FAILED_5 = PodAnnotations("s-4", "s-5", ReplicaState.FAILED, LATER, LoadPath.DELTA,
                          reasons.CHECKSUM_MISMATCH, "bad", "s-5")  # fmt: skip


class _Pod:
    """The stub's pod, at ``READY_4`` with the gate True; every patch is recorded."""

    def __init__(self) -> None:
        annotations = {k: v for k, v in READY_4.values().items() if v is not None}
        self.body: dict[str, Any] = {
            "metadata": {"name": "demo-0", "namespace": "ns", "uid": "u1",
                         "resourceVersion": "5", "annotations": annotations},
            **condition_patch(VERIFIED, MOMENT),
        }  # fmt: skip
        self.patched_states: list[str | None] = []
        self.patched = asyncio.Event()

    async def watch(self, request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        stream = web.StreamResponse()
        await stream.prepare(request)
        await closing.wait()
        return stream

    async def read(self, request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        return web.json_response(self.body)

    async def patch(self, request: web.Request, closing: asyncio.Event) -> web.StreamResponse:
        change = json.loads(await request.read()).get("metadata", {}).get("annotations", {})
        metadata = self.body["metadata"]
        kept = {**metadata["annotations"], **change}
        metadata["annotations"] = {k: v for k, v in kept.items() if v is not None}
        metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 1)
        self.patched_states.append(change.get(ANNOTATION_STATE))
        self.patched.set()
        return web.json_response(self.body)


@asynccontextmanager
async def _writer(pod: _Pod) -> AsyncIterator[PodWriter]:
    routes = [("GET", PODS, pod.watch), ("GET", f"{PODS}/demo-0", pod.read),
              ("PATCH", f"{PODS}/demo-0/status", pod.patch)]  # fmt: skip
    async with serving_routes(routes) as host:
        configuration = Configuration()
        configuration.host = host
        async with ApiClient(configuration) as api:
            writer = PodWriter(
                api, "ns", "demo-0", RetryPolicy(initial_s=0.01, maximum_s=0.02),
                loading_report_after_s=HOLD_S,
            )  # fmt: skip
            assert await writer.observe_at_start(lambda attempt: 0.01) is not None
            running = asyncio.create_task(writer.run())
            try:
                yield writer
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)


async def test_with_the_clock_running_a_held_report_is_written_when_its_hold_ends() -> None:
    pod = _Pod()
    async with _writer(pod) as writer:
        writer.publish(LOADING_5, VERIFIED)
        await asyncio.wait_for(pod.patched.wait(), timeout=10)
    assert pod.patched_states == ["Loading"]


async def test_a_wait_for_a_turn_to_build_is_not_loading_time() -> None:
    pod = _Pod()
    longest_hold_s = HOLD_S * (1 + HOLD_SPREAD)
    async with _writer(pod) as writer:
        with writer.hold_stopped():
            writer.publish(LOADING_5, VERIFIED)
            # Waiting for the turn, five holds long: the clock stands, nothing is written.
            await asyncio.sleep(5 * longest_hold_s)
            assert pod.patched_states == []
        # The turn came and the quick load ended: its end is the one write.
        writer.publish(READY_5, VERIFIED)
        await asyncio.wait_for(writer.settled(), timeout=10)
    assert pod.patched_states == ["Ready"]
    assert writer.patches == 1


async def test_the_hold_resumes_after_the_wait_and_a_slow_load_shows() -> None:
    pod = _Pod()
    async with _writer(pod) as writer:
        with writer.hold_stopped():
            writer.publish(LOADING_5, VERIFIED)
            await asyncio.sleep(2 * HOLD_S)
        await asyncio.wait_for(pod.patched.wait(), timeout=10)
    assert pod.patched_states == ["Loading"]


async def test_a_failure_goes_at_once_while_the_clock_stands() -> None:
    pod = _Pod()
    async with _writer(pod) as writer:
        with writer.hold_stopped():
            writer.publish(FAILED_5, VERIFIED)
            await asyncio.wait_for(pod.patched.wait(), timeout=10)
    assert pod.patched_states == ["Failed"]


async def test_an_unchanged_report_is_not_compared_again(monkeypatch: pytest.MonkeyPatch) -> None:
    pod = _Pod()
    compared: list[int] = []
    differ: Callable[..., bool] = pod_writer.annotations_differ

    def counting(*args: object) -> bool:
        compared.append(1)
        return differ(*args)

    monkeypatch.setattr(pod_writer, "annotations_differ", counting)
    async with _writer(pod) as writer:
        writer.publish(READY_5, VERIFIED)
        await asyncio.wait_for(writer.settled(), timeout=10)
        assert pod.patched_states == ["Ready"]
        before = len(compared)
        for _ in range(100):  # the agent's passes: the same report each time
            writer.publish(
                PodAnnotations("s-5", "s-5", ReplicaState.READY, LATER, LoadPath.DELTA),
                readiness_gate(4, "s-4", 4, None),
            )
        assert len(compared) == before
        # A new report is compared and written as before.
        writer.publish(FAILED_5, VERIFIED)
        await asyncio.wait_for(writer.settled(), timeout=10)
    assert pod.patched_states == ["Ready", "Failed"]
