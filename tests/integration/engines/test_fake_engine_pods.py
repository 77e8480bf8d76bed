"""Swaps against the fake SGLang and vLLM engines, run by the pod runtime in a real region.

Each replica is examples/pod.yaml with the engine container running ``hotload engine
fake-sglang`` or ``fake-vllm`` (the released routes, the released answers) and the real
sidecar with ``spec.engine.kind`` sglang or vllm, so the adapter, the sidecar and the pod
runtime all run as they would beside the real engine. The fake's ``/hotload_fake/*``
routes (no released engine has them) arm a failure inside the next load and show which
tensors it serves.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import watch
from urllib3.exceptions import ProtocolError

from hotload.api import EngineKind
from hotload.api.pod import (
    ANNOTATION_FAILED_SNAPSHOT,
    ANNOTATION_REASON,
    ANNOTATION_SNAPSHOT,
    ANNOTATION_VIA,
    CONDITION_SNAPSHOT_READY,
)
from hotload.testing.weights import snapshot_checksums
from tests.fixtures.trainer import Trainer
from tests.integration.sidecar.conftest import (  # noqa: F401  (fixtures)
    bucket_dir,
    bucket_url,
    harness,
    storage,
    trainer,
)
from tests.integration.sidecar.harness import (
    ENGINE_PORT,
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
)

pytestmark = pytest.mark.cluster

FAKE_COMMANDS = {
    EngineKind.SGLANG: [
        "hotload", "engine", "fake-sglang", "--port", str(ENGINE_PORT),
        "--model-path", "/models/policy", "--served-model-name", "fake-sglang",
        "--token-interval", "0.01",
    ],
    EngineKind.VLLM: [
        "hotload", "engine", "fake-vllm", "--port", str(ENGINE_PORT),
        "--model", "/models/policy", "--served-model-name", "fake-vllm",
        "--token-interval", "0.01",
    ],
}  # fmt: skip


class PodHistory:
    """Every version of one pod the API server holds, from a watch (no write is missed)."""

    def __init__(self, api: k8s.ApiClient, namespace: str, pod: str) -> None:
        self.seen: list[k8s.V1Pod] = []
        self._watch = watch.Watch()
        core = k8s.CoreV1Api(api)
        self._thread = threading.Thread(target=self._run, args=(core, namespace, pod), daemon=True)
        self._thread.start()

    def _run(self, core: k8s.CoreV1Api, namespace: str, pod: str) -> None:
        try:
            for event in self._watch.stream(
                core.list_namespaced_pod,
                namespace,
                field_selector=f"metadata.name={pod}",
                timeout_seconds=300,
            ):
                self.seen.append(event["object"])
        except (ProtocolError, k8s.ApiException):
            return  # the watch was stopped or its namespace deleted: the history is complete

    def gate_reasons(self) -> list[str]:
        reasons: list[str] = []
        for pod in self.seen:
            for condition in (pod.status.conditions if pod.status else None) or []:
                if condition.type == CONDITION_SNAPSHOT_READY and condition.status == "False":
                    reasons.append(condition.reason or "")
        return reasons

    def stop(self) -> None:
        self._watch.stop()


@pytest.fixture
def history_of(harness: SidecarHarness) -> Iterator[Any]:  # noqa: F811
    histories: list[PodHistory] = []

    def start(replica: Replica) -> PodHistory:
        history = PodHistory(harness.api, harness.namespace, replica.pod)
        histories.append(history)
        return history

    yield start
    for history in histories:
        history.stop()


async def fake_replica(harness: SidecarHarness, kind: EngineKind, name: str) -> Replica:  # noqa: F811
    """A pod whose engine container runs the fake of ``kind``."""
    original = harness.pod_body

    def manifest(*args: Any, **kwargs: Any) -> dict[str, Any]:
        pod = original(*args, **kwargs)
        for container in pod["spec"]["containers"]:
            if container["name"] == "engine":
                container["command"] = list(FAKE_COMMANDS[kind])
                if kind is EngineKind.VLLM:
                    container["env"] += [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]
        return pod

    harness.pod_body = manifest  # type: ignore[method-assign]
    try:
        return await harness.replica(f"{name}-0", name)
    finally:
        harness.pod_body = original  # type: ignore[method-assign]


async def engine_state(replica: Replica) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"{replica.engine_url}/hotload_fake/state", timeout=10)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


async def arm_failure(replica: Replica, after_tensors: int) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(
            f"{replica.engine_url}/hotload_fake/fail_next_load",
            json={"after_tensors": after_tensors},
            timeout=10,
        )
        response.raise_for_status()


@pytest.mark.parametrize("kind", [EngineKind.SGLANG, EngineKind.VLLM], ids=str)
async def test_a_load_failing_midway_is_undone_by_a_reload_before_any_request_runs(
    kind: EngineKind,
    harness: SidecarHarness,  # noqa: F811
    trainer: Trainer,  # noqa: F811
    bucket_url: str,  # noqa: F811
    history_of: Any,
) -> None:
    name = f"fake-{kind.value}"
    harness.create_deployment(rollout_deployment(name, bucket_url, engine=kind))
    replica = await fake_replica(harness, kind, name)
    good = await trainer.publish_full()
    harness.set_target(name, good.ref())
    await harness.wait_state(replica, good.identity, "Ready", timeout=120)
    assert (await engine_state(replica))["checksums"] == snapshot_checksums(good.weights)

    history = history_of(replica)
    await arm_failure(replica, after_tensors=3)
    trainer.train_step()
    bad = await trainer.publish_full()
    harness.set_target(name, bad.ref())
    annotations = await harness.wait_state(replica, bad.identity, "Failed", timeout=120)
    assert annotations[ANNOTATION_REASON] == "EngineRejected"
    assert annotations[ANNOTATION_FAILED_SNAPSHOT] == bad.identity

    async def back_on_good() -> dict[str, str] | None:
        now = harness.annotations(replica.pod)
        gate = harness.gate(replica.pod)
        if now.get(ANNOTATION_SNAPSHOT) == good.identity and gate and gate.status == "True":
            return now
        return None

    settled = await eventually(back_on_good, timeout=120, what="the last good, served on")
    # The handover reloaded the last good before the engine took any request (the engine
    # has no rollback): the pod never said NotLoaded, its snapshot never left the good one.
    assert settled[ANNOTATION_VIA] != "reload"
    assert "NotLoaded" not in history.gate_reasons()
    served = await engine_state(replica)
    assert served["checksums"] == snapshot_checksums(good.weights)  # bit for bit, verified
    assert served["version"] == good.identity
    completion = await harness.complete(replica)
    assert completion.status_code == 200, completion.text
    assert completion.json()["model"] == f"{name}@{good.identity}"
