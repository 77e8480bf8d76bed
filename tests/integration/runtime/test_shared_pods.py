"""Many pods, few processes: shared pods' agents run as tasks in one host per deployment.

Three pods annotated ``hotload.dev/runtime: shared`` (the sidecar and a ``noop`` engine)
of one RolloutDeployment: the real sidecar agent of each runs in one host process, with
its own identity and pod-bound token (it writes its own pod, under the sidecar RBAC),
loads the deployment's target snapshot from a ``file://`` bucket and reports; the
runtime turns each pod Ready once its agent's gate is True. Deleting the pods ends the
agents and then the host.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api.pod import (
    ANNOTATION_SNAPSHOT,
    ANNOTATION_STATE,
    CONDITION_SNAPSHOT_READY,
)
from hotload.local import Region
from hotload.local.runtime.process_ledger import start_ticks
from tests.integration.runtime.conftest import (
    condition,
    container_status,
    read_pod,
    wait_for,
)
from tests.integration.runtime.shared_fleet import install_shared_deployment, shared_pod
from tests.integration.runtime.tiny_snapshot import publish_tiny_full

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

PODS = 3
DEPLOYMENT = "fleet"


def _host_pid(pod: dict[str, Any]) -> int:
    """The host process of a shared pod's agent (``hotload-agent://<pid>/<uid>``)."""
    container_id = container_status(pod, "sidecar")["containerID"]
    return int(container_id.split("://", 1)[1].split("/", 1)[0])


def test_shared_pods_run_the_real_agent_as_tasks_of_one_host_and_turn_ready(
    core: k8s.CoreV1Api,
    kube_clients: dict[str, k8s.ApiClient],
    region: Region,
    module_namespace: str,
    tmp_path: Path,
) -> None:
    ns = module_namespace
    api = kube_clients[region.name]
    bucket = tmp_path / "bucket"
    target = asyncio.run(publish_tiny_full(bucket, tmp_path / "work", "tiny-step-1", 1))
    deployment = install_shared_deployment(
        api,
        ns,
        DEPLOYMENT,
        bucket=bucket,
        replicas=PODS,
        target=target.model_dump(mode="json", by_alias=True),
    )
    names = [f"{DEPLOYMENT}-{n}" for n in range(PODS)]
    for name in names:
        core.create_namespaced_pod(ns, shared_pod(deployment, name))

    def all_ready() -> list[dict[str, Any]] | None:
        # Ready (the gate) and the state annotation are two writes; wait for both to settle.
        pods = [read_pod(core, ns, name) or {} for name in names]
        settled = all(
            condition(p, "Ready") == "True"
            and (p.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_STATE) == "Ready"
            for p in pods
        )
        return pods if settled else None

    pods = wait_for("every shared pod Ready (its agent loaded the target)", all_ready, 180)
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations[ANNOTATION_STATE] == "Ready", "each agent reported on its own pod"
        assert annotations[ANNOTATION_SNAPSHOT] == target.identity
        assert condition(pod, CONDITION_SNAPSHOT_READY) == "True"
        assert container_status(pod, "engine")["state"].get("running") is not None
    hosts = {_host_pid(pod) for pod in pods}
    assert len(hosts) == 1, "one host process runs every agent of the deployment"
    (host,) = hosts
    assert len({pod["status"]["podIP"] for pod in pods}) == PODS

    core.delete_namespaced_pod(names[0], ns)
    wait_for("the first pod gone", lambda: read_pod(core, ns, names[0]) is None, 30)
    assert start_ticks(host) is not None, "the host keeps serving the other pods"
    for name in names[1:]:
        core.delete_namespaced_pod(name, ns)
    wait_for("the host to exit with its last agent", lambda: start_ticks(host) is None, 30)
