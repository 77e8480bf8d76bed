"""Pods of ours run as real local processes on the region's fake nodes.

A StatefulSet of three pods, each with two containers of ``hotload local echo-server``
(the runtime's own check workload), behind a Service: every pod listens on its own
127.i.x.y address, talks to the API with its own pod-bound ServiceAccount token, is
Ready only once its readiness gate is True, gets Service traffic only while Ready,
restarts a killed container, and stops within its grace period when deleted.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from hotload.api.pod import CONDITION_SNAPSHOT_READY, SESSION_HEADER
from hotload.local import Region
from hotload.local.runtime import read_ports
from hotload.local.runtime.process_ledger import start_ticks
from tests.integration.runtime.conftest import (
    TOLERATION,
    condition,
    container_status,
    read_pod,
    set_gate,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

REPLICAS = 3
POD_ENV = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
]


def _echo(name: str, port: int, mount: str, *extra: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "hotload:dev",
        "command": ["hotload", "local", "echo-server", "--port", str(port), *extra],
        "ports": [{"name": f"{name}-port", "containerPort": port}],
        "env": POD_ENV,
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": f"{name}-port"},
            "periodSeconds": 1,
        },
        "volumeMounts": [{"name": "staging", "mountPath": mount}],
    }


def _pod_spec(*containers: dict[str, Any], grace: int = 3) -> dict[str, Any]:
    return {
        "serviceAccountName": "echo",
        "terminationGracePeriodSeconds": grace,
        "readinessGates": [{"conditionType": CONDITION_SNAPSHOT_READY}],
        "tolerations": [TOLERATION],
        "volumes": [{"name": "staging", "emptyDir": {"medium": "Memory"}}],
        "containers": list(containers),
    }


def _client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=10.0)


def _pid(pod: dict[str, Any], container: str) -> int:
    return int(container_status(pod, container)["containerID"].rsplit("/", 1)[-1])


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.fixture(scope="module")
def echo_set(
    core: k8s.CoreV1Api,
    kube_clients: dict[str, k8s.ApiClient],
    region: Region,
    module_namespace: str,
) -> list[dict[str, Any]]:
    """The StatefulSet's pods, once each has both containers running."""
    ns = module_namespace
    api = kube_clients[region.name]
    core.create_namespaced_service_account(ns, {"metadata": {"name": "echo"}})
    rbac = k8s.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "read-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "read-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-pods",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "echo", "namespace": ns}],
        },
    )
    labels = {"app": "echo"}
    k8s.AppsV1Api(api).create_namespaced_stateful_set(
        ns,
        {
            "metadata": {"name": "echo"},
            "spec": {
                "replicas": REPLICAS,
                "serviceName": "echo",
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(
                        _echo("web", 8080, "/var/lib/hotload/staging"), _echo("side", 8081, "/data")
                    ),
                },
            },
        },
    )
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "echo"},
            "spec": {
                "selector": labels,
                "ports": [{"name": "http", "port": 80, "targetPort": "web-port"}],
            },
        },
    )

    def all_running() -> list[dict[str, Any]] | None:
        pods = [read_pod(core, ns, f"echo-{n}") for n in range(REPLICAS)]
        ok = all(
            pod is not None
            and condition(pod, "ContainersReady") == "True"
            and all("running" in s["state"] for s in pod["status"]["containerStatuses"])
            for pod in pods
        )
        return [p for p in pods if p is not None] if ok else None

    return wait_for("three echo pods with both containers running and ready", all_running, 120)


@pytest.fixture
def service_url(region: Region, module_namespace: str, echo_set: list[dict[str, Any]]) -> str:
    ports = wait_for(
        "the Service's local port in services.json",
        lambda: read_ports(region.services_file).get(f"{module_namespace}/echo"),
    )
    return f"http://127.0.0.1:{ports['http']}"


def test_every_pod_listens_on_its_own_loopback_address(
    region: Region, echo_set: list[dict[str, Any]]
) -> None:
    network = ipaddress.IPv4Network(f"127.{region.index}.0.0/16")
    kwok_share = ipaddress.IPv4Network(f"127.{region.index}.0.0/24")
    addresses = [pod["status"]["podIP"] for pod in echo_set]
    assert len(set(addresses)) == REPLICAS
    with _client() as client:
        for pod in echo_set:
            ip = ipaddress.IPv4Address(pod["status"]["podIP"])
            assert ip in network and ip not in kwok_share
            for port in (8080, 8081):
                answer = client.get(f"http://{ip}:{port}/who").json()
                assert answer["pod"] == pod["metadata"]["name"]
                assert answer["ip"] == str(ip)
                assert answer["node"] == pod["spec"]["nodeName"]
            assert pod["status"]["hostIP"] == "127.0.0.1"


def test_containers_call_the_api_with_their_pods_own_bound_token(
    module_namespace: str, echo_set: list[dict[str, Any]]
) -> None:
    pod = echo_set[0]
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    with _client() as client:
        allowed = client.get(
            f"http://{ip}:8080/kube/api/v1/namespaces/{module_namespace}/pods/{name}"
        ).json()
        forbidden = client.get(
            f"http://{ip}:8080/kube/api/v1/namespaces/{module_namespace}/secrets"
        ).json()
        review = client.get(f"http://{ip}:8081/whoami").json()
    assert allowed["status"] == 200, allowed
    assert forbidden["status"] == 403, "RBAC applies to the pod's token: no rule grants secrets"
    assert f"system:serviceaccount:{module_namespace}:echo" in forbidden["body"]["message"]
    user = review["body"]["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{module_namespace}:echo"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == [name]
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]


def test_a_containers_environment_is_the_pods_world_not_the_runtimes(
    region: Region, echo_set: list[dict[str, Any]]
) -> None:
    pod = echo_set[1]
    env = _environ(_pid(pod, "web"))
    assert env["POD_IP"] == pod["status"]["podIP"]
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert int(env["KUBERNETES_SERVICE_PORT"]) == region.ports.apiserver
    assert Path(env["KUBECONFIG"]).is_file()
    assert "client-certificate" not in Path(env["KUBECONFIG"]).read_text()
    web_root = Path(env["HOTLOAD_ROOT"])
    side_root = Path(_environ(_pid(pod, "side"))["HOTLOAD_ROOT"])
    assert web_root != side_root
    assert os.path.samefile(web_root / "var/lib/hotload/staging", side_root / "data"), (
        "both containers reach the pod's one staging volume"
    )


def test_a_pod_is_ready_only_once_its_gate_is_true_and_only_ready_pods_get_traffic(
    core: k8s.CoreV1Api,
    region: Region,
    module_namespace: str,
    echo_set: list[dict[str, Any]],
    service_url: str,
) -> None:
    ns = module_namespace
    assert all(
        condition(read_pod(core, ns, p["metadata"]["name"]) or {}, "Ready") == "False"
        for p in echo_set
    )
    with _client() as client:
        assert client.get(f"{service_url}/").status_code == 503
        for name in ("echo-0", "echo-1"):
            set_gate(core, ns, name, "True", CONDITION_SNAPSHOT_READY)
        for name in ("echo-0", "echo-1"):
            wait_for(
                f"{name} Ready",
                lambda n=name: condition(read_pod(core, ns, n) or {}, "Ready") == "True",
            )
        assert condition(read_pod(core, ns, "echo-2") or {}, "Ready") == "False"
        served = wait_for(
            "both Ready pods to be served through the Service",
            lambda: (
                (s := {client.get(f"{service_url}/").headers["x-hotload-pod"] for _ in range(6)})
                == {f"{ns}/echo-0", f"{ns}/echo-1"}
                and s
            ),
        )
        assert f"{ns}/echo-2" not in served
        session = {SESSION_HEADER: "conversation-1"}
        first = client.get(f"{service_url}/", headers=session).json()["pod"]
        for _ in range(4):
            assert client.get(f"{service_url}/", headers=session).json()["pod"] == first
        set_gate(core, ns, first, "False", CONDITION_SNAPSHOT_READY)
        wait_for(
            f"{first} not Ready",
            lambda: condition(read_pod(core, ns, first) or {}, "Ready") == "False",
        )
        moved = wait_for(
            "the session to move off the pod that left",
            lambda: (
                (p := client.get(f"{service_url}/", headers=session).json()["pod"]) != first and p
            ),
        )
        assert moved in ("echo-0", "echo-1")
        with client.stream("GET", f"{service_url}/stream?n=3") as response:
            events = [line for line in response.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) == 4
    # The runtime routes from readiness alone: the region runs no endpoint controllers,
    # which could never write a loopback address and retried each refusal with every
    # address of the Service in the error (12 CPU-s per rollout at 1,000 pods).
    slices = k8s.DiscoveryV1Api(core.api_client).list_namespaced_endpoint_slice(ns)
    assert slices.items == []
    manager_log = (region.logs_dir / "kube-controller-manager.log").read_text()
    assert "may not be in the loopback range" not in manager_log


def test_killing_a_containers_process_shows_a_terminated_container_and_a_restart(
    core: k8s.CoreV1Api, module_namespace: str, echo_set: list[dict[str, Any]]
) -> None:
    name = "echo-2"
    before = read_pod(core, module_namespace, name)
    assert before is not None
    pid = _pid(before, "side")
    count = container_status(before, "side")["restartCount"]
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        pod = read_pod(core, module_namespace, name) or {}
        status = container_status(pod, "side")
        return (
            status
            if status.get("restartCount") == count + 1 and "running" in status.get("state", {})
            else None
        )

    status = wait_for("the killed container to be restarted", restarted)
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert status["lastState"]["terminated"]["containerID"].endswith(f"/{pid}")
    assert _pid({"status": {"containerStatuses": [status]}}, "side") != pid
    assert (
        container_status(read_pod(core, module_namespace, name) or {}, "web")["restartCount"] == 0
    )


@pytest.mark.parametrize("stubborn", [False, True], ids=["stops-on-sigterm", "ignores-sigterm"])
def test_deleting_a_pod_stops_its_processes_within_its_grace_period(
    core: k8s.CoreV1Api, module_namespace: str, echo_set: list[dict[str, Any]], stubborn: bool
) -> None:
    grace = 3
    name = f"leaving-{'stubborn' if stubborn else 'polite'}"
    extra = ("--ignore-sigterm",) if stubborn else ()
    core.create_namespaced_pod(
        module_namespace,
        {
            "metadata": {"name": name},
            "spec": _pod_spec(_echo("web", 8080, "/s", *extra), grace=grace),
        },
    )
    pod = wait_for(
        f"{name} serving (its SIGTERM handling in place)",
        lambda: (
            (p := read_pod(core, module_namespace, name))
            and container_status(p, "web").get("ready")
            and p
        ),
    )
    pid = _pid(pod, "web")
    assert start_ticks(pid) is not None
    began = time.monotonic()
    core.delete_namespaced_pod(name, module_namespace)
    wait_for("the pod's process to end", lambda: start_ticks(pid) is None, timeout=grace + 10)
    stopped = time.monotonic() - began
    wait_for(
        "the pod to be gone", lambda: read_pod(core, module_namespace, name) is None, timeout=15
    )
    if stubborn:
        assert grace - 0.5 <= stopped <= grace + 5, "SIGKILL comes when the grace period ends"
    else:
        assert stopped < grace, "a process that stops on SIGTERM does not wait out the grace"


def test_containers_it_cannot_run_wait_with_a_reason_never_a_fake_success(
    core: k8s.CoreV1Api, module_namespace: str, echo_set: list[dict[str, Any]]
) -> None:
    other = {"name": "proxy", "image": "nginx:1.27", "command": ["nginx", "-g", "daemon off;"]}
    core.create_namespaced_pod(
        module_namespace,
        {"metadata": {"name": "mixed"}, "spec": _pod_spec(_echo("web", 8080, "/s"), other)},
    )

    def reported() -> dict[str, Any] | None:
        pod = read_pod(core, module_namespace, "mixed") or {}
        ours, theirs = container_status(pod, "web"), container_status(pod, "proxy")
        return pod if "running" in ours.get("state", {}) and theirs else None

    pod = wait_for("the mixed pod's container statuses", reported)
    waiting = container_status(pod, "proxy")["state"]["waiting"]
    assert waiting["reason"] == "UnsupportedCommand"
    assert "nginx -g daemon off;" in waiting["message"]
    assert pod["status"]["phase"] == "Pending"
    assert condition(pod, "ContainersReady") == "False"
    core.delete_namespaced_pod("mixed", module_namespace)


def test_a_container_waits_for_a_missing_secret_and_starts_once_it_exists(
    core: k8s.CoreV1Api, module_namespace: str, echo_set: list[dict[str, Any]]
) -> None:
    container = _echo("web", 8080, "/s")
    container["env"] = [
        *POD_ENV,
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "later", "key": "key"}}},
    ]
    core.create_namespaced_pod(
        module_namespace, {"metadata": {"name": "patient"}, "spec": _pod_spec(container)}
    )
    waiting = wait_for(
        "the container to wait for its Secret",
        lambda: (
            container_status(read_pod(core, module_namespace, "patient") or {}, "web")
            .get("state", {})
            .get("waiting", {})
            .get("reason")
            == "CreateContainerConfigError"
        ),
    )
    assert waiting
    core.create_namespaced_secret(
        module_namespace, {"metadata": {"name": "later"}, "stringData": {"key": "s3cret"}}
    )
    pod = wait_for(
        "the container to start once the Secret exists",
        lambda: (
            (p := read_pod(core, module_namespace, "patient"))
            and "running" in container_status(p, "web").get("state", {})
            and p
        ),
        timeout=90,
    )
    assert _environ(_pid(pod, "web"))["API_KEY"] == "s3cret"
    core.delete_namespaced_pod("patient", module_namespace)


@pytest.fixture(autouse=True)
def _no_private_addresses(echo_set: list[dict[str, Any]]) -> Iterator[None]:
    """Traffic only ever goes to 127.0.0.0/8: every address the runtime wrote is loopback."""
    yield
    for pod in echo_set:
        assert ipaddress.IPv4Address(pod["status"]["podIP"]).is_loopback
