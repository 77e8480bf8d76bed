"""Workloads on a local region's fake GPU nodes, run by kwok with our Stages: plain pods
are scheduled and turn Running; pods with a container of ours are left to the pod
runtime; readiness gates are never forged."""

from __future__ import annotations

import json
from ipaddress import IPv4Address
from typing import Any

import pytest
import yaml

from hotload.api.pod import CONDITION_SNAPSHOT_READY
from hotload.local import LocalRegions, Region
from hotload.local.processes import is_alive, read_records
from hotload.local.runtime.launcher import PROCESS_NAME as RUNTIME_PROCESS
from hotload.waiting import wait_until
from tests.fixtures.cluster import Kubectl

pytestmark = pytest.mark.cluster

TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def _pod(name: str, *, command: list[str] | None = None, gated: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/fake:1"}
    if command is not None:
        container["command"] = command
    spec: dict[str, Any] = {"tolerations": [TOLERATION], "containers": [container]}
    if gated:
        spec["readinessGates"] = [{"conditionType": CONDITION_SNAPSHOT_READY}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _get_pod(kubectl: Kubectl, namespace: str, name: str, context: str) -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(
        kubectl("get", "pod", name, "-n", namespace, "-o", "json", context=context)
    )
    return pod


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == kind:
            return dict(condition)
    return None


def _runtime_runs(region: Region) -> bool:
    """Whether the pod runtime is one of the region's processes (it takes over our pods)."""
    return any(r.name == RUNTIME_PROCESS and is_alive(r) for r in read_records(region.pids_dir))


def test_statefulset_pods_run_on_the_fake_gpu_nodes(
    local_regions: LocalRegions, kubectl: Kubectl, namespace: str
) -> None:
    region = local_regions["region-2"]
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "gpu"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "gpu"}},
            "template": {
                "metadata": {"labels": {"app": "gpu"}},
                "spec": {
                    "tolerations": [TOLERATION],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "registry.invalid/fake:1",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}},
                        }
                    ],
                },
            },
        },
    }
    kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(statefulset), context=region.name
    )
    kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.readyReplicas}=3", "statefulset/gpu",
        "--timeout=60s", context=region.name,
    )  # fmt: skip
    pods = json.loads(
        kubectl("get", "pods", "-n", namespace, "-l", "app=gpu", "-o", "json", context=region.name)
    )["items"]
    assert len(pods) == 3
    nodes = set(region.node_names())
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in nodes
        assert IPv4Address(pod["status"]["podIP"]) in region.kwok_network
    # 4 GPUs each on 8-GPU nodes: the scheduler had to spread them over both nodes.
    assert len({pod["spec"]["nodeName"] for pod in pods}) == 2
    labels = json.loads(
        kubectl("get", "node", pods[0]["spec"]["nodeName"], "-o", "json", context=region.name)
    )["metadata"]["labels"]
    assert labels["topology.kubernetes.io/region"] == "region-2"


def test_pods_with_a_hotload_container_are_left_to_the_pod_runtime(
    local_regions: LocalRegions, kubectl: Kubectl, namespace: str
) -> None:
    region = local_regions["region-1"]
    ours = _pod("ours", command=["hotload", "sidecar"])
    ours["spec"]["containers"].insert(0, {"name": "plain", "image": "registry.invalid/fake:1"})
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(ours))
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_pod("theirs")))
    kubectl(
        "wait",
        "-n",
        namespace,
        "--for=jsonpath={.status.phase}=Running",
        "pod/theirs",
        "--timeout=60s",
    )

    # kwok has played its stages on the pod created after ours; give it a moment more to
    # prove it never plays them on ours.
    def still_left_alone() -> bool:
        pod = _get_pod(kubectl, namespace, "ours", region.name)
        assert pod["spec"].get("nodeName") in region.node_names(), "ours must be scheduled"
        ip = pod["status"].get("podIP")
        assert ip is None or IPv4Address(ip) not in region.kwok_network, "kwok gave ours an IP"
        if not _runtime_runs(region):
            assert pod["status"]["phase"] == "Pending"
            assert ip is None
            assert "containerStatuses" not in pod["status"]
        return False  # not a condition to reach: checked again until the 2 s are up

    wait_until(still_left_alone, 2.0, interval_s=0.2)


def test_kwok_does_not_forge_readiness_gates(
    local_regions: LocalRegions, kubectl: Kubectl, namespace: str
) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_pod("gated", gated=True)))
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_pod("ungated")))
    for name in ("gated", "ungated"):
        kubectl(
            "wait",
            "-n",
            namespace,
            "--for=jsonpath={.status.phase}=Running",
            f"pod/{name}",
            "--timeout=60s",
        )

    gated = _get_pod(kubectl, namespace, "gated", "region-1")
    assert _condition(gated, CONDITION_SNAPSHOT_READY) is None
    ready = _condition(gated, "Ready")
    assert ready is not None and ready["status"] == "False"
    assert ready["reason"] == "ReadinessGatesNotReady"
    containers_ready = _condition(gated, "ContainersReady")
    assert containers_ready is not None and containers_ready["status"] == "True"

    ungated = _get_pod(kubectl, namespace, "ungated", "region-1")
    assert (_condition(ungated, "Ready") or {}).get("status") == "True"
