"""The runtime's own life, on a region of its own: a crash and a restart, then ``down``.

A runtime killed outright takes its containers with it (no orphan); the one that starts
next cleans up what the last one recorded and runs the pods again as a rebooted node
would (restartCount up, lastState saying why, same pod IP, same Service port).
``hotload local down`` then leaves no process and no port: container processes, the
shared host, pod addresses and Service ports are all checked.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from hotload.errors import RegionIndexTaken
from hotload.local import LocalRegions, Region, down, up
from hotload.local import processes as region_processes
from hotload.local.bootstrap import api_client
from hotload.local.runtime import PROCESS_NAME, read_ports, ready_file, runtime_process
from hotload.local.runtime.launcher import settings_for
from hotload.local.runtime.process_ledger import start_ticks
from tests.integration.runtime.conftest import (
    TOLERATION,
    condition,
    container_status,
    read_pod,
    wait_for,
)
from tests.integration.runtime.shared_fleet import install_shared_deployment, shared_pod

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]

NS = "default"
ECHO_ENV = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
]


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegions]:
    """One region of its own (the session's regions must not lose their runtime)."""
    state = tmp_path_factory.mktemp("solo")
    regions = None
    for base in range(171, 200):
        try:
            regions = up(["solo"], state_dir=state, index_base=base, nodes=1)
            break
        except RegionIndexTaken:
            continue
    assert regions is not None, "no free address index for the test region"
    try:
        yield regions
    finally:
        down(state)


@pytest.fixture(scope="module")
def solo_region(solo: LocalRegions) -> Region:
    return solo.regions[0]


@pytest.fixture(scope="module")
def solo_core(solo_region: Region) -> Iterator[k8s.CoreV1Api]:
    with api_client(solo_region) as api:
        yield k8s.CoreV1Api(api)


def _echo_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "echo", "labels": {"app": "echo"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "tolerations": [TOLERATION],
            "containers": [
                {
                    "name": "web",
                    "image": "hotload:dev",
                    "command": ["hotload", "local", "echo-server", "--port", "8080"],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": ECHO_ENV,
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http"},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }


def _runtime_record(region: Region) -> region_processes.ProcessRecord:
    (record,) = [
        r for r in region_processes.read_records(region.pids_dir) if r.name == PROCESS_NAME
    ]
    return record


def _pid(pod: dict[str, Any], container: str) -> int:
    return int(container_status(pod, container)["containerID"].rsplit("/", 1)[-1])


def _running_echo(core: k8s.CoreV1Api) -> dict[str, Any] | None:
    pod = read_pod(core, NS, "echo")
    return pod if pod and condition(pod, "Ready") == "True" else None


def _refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return False
    except OSError:
        return True


def test_a_restarted_runtime_cleans_up_and_runs_its_pods_again(
    solo_region: Region, solo_core: k8s.CoreV1Api
) -> None:
    core = solo_core
    wait_for("the default ServiceAccount", lambda: core.list_namespaced_service_account(NS).items)
    core.create_namespaced_pod(NS, _echo_pod())
    core.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "echo"},
            "spec": {
                "selector": {"app": "echo"},
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
            },
        },
    )
    before = wait_for("the echo pod Ready", lambda: _running_echo(core), 90)
    port = wait_for(
        "its Service port", lambda: read_ports(solo_region.services_file).get(f"{NS}/echo")
    )["http"]
    old_pid = _pid(before, "web")

    os.kill(_runtime_record(solo_region).pid, signal.SIGKILL)
    wait_for("the container to die with its runtime", lambda: start_ticks(old_pid) is None, 10)

    ready_file(settings_for(solo_region)).unlink(missing_ok=True)
    region_processes.start(
        runtime_process(solo_region, {}), solo_region.logs_dir, solo_region.pids_dir
    )
    wait_for("the new runtime ready", lambda: ready_file(settings_for(solo_region)).is_file(), 60)

    def restarted() -> dict[str, Any] | None:
        pod = _running_echo(core)
        return pod if pod and container_status(pod, "web")["restartCount"] == 1 else None

    after = wait_for("the pod running again", restarted, 90)
    status = container_status(after, "web")
    assert status["lastState"]["terminated"]["reason"] == "Unknown"
    assert after["status"]["podIP"] == before["status"]["podIP"], "a pod keeps its address"
    assert _pid(after, "web") != old_pid
    assert read_ports(solo_region.services_file)[f"{NS}/echo"]["http"] == port, "the port is stable"
    with httpx.Client(trust_env=False, timeout=10) as client:
        assert client.get(f"http://127.0.0.1:{port}/").json()["pod"] == "echo"


def test_down_leaves_no_process_and_no_port(
    solo: LocalRegions, solo_region: Region, solo_core: k8s.CoreV1Api, tmp_path: Path
) -> None:
    core = solo_core
    with api_client(solo_region) as api:
        deployment = install_shared_deployment(api, NS, "fleet", bucket=tmp_path, replicas=2)
    for name in ("fleet-0", "fleet-1"):
        core.create_namespaced_pod(NS, shared_pod(deployment, name))

    def shared_running() -> list[dict[str, Any]] | None:
        pods = [read_pod(core, NS, n) or {} for n in ("fleet-0", "fleet-1")]
        ok = all("running" in container_status(p, "sidecar").get("state", {}) for p in pods)
        return pods if ok else None

    shared = wait_for("the shared pods' agents running", shared_running, 90)
    echo = wait_for("the echo pod Ready", lambda: _running_echo(core), 60)
    pids = {_pid(echo, "web"), _runtime_record(solo_region).pid}
    pids |= {
        int(container_status(p, "sidecar")["containerID"].split("//")[1].split("/")[0])
        for p in shared
    }
    assert all(start_ticks(pid) is not None for pid in pids)
    addresses = [(echo["status"]["podIP"], 8080)]
    service_ports = [
        p for ports in read_ports(solo_region.services_file).values() for p in ports.values()
    ]
    assert service_ports and not _refused(*addresses[0])

    down(solo.state_dir)

    assert [pid for pid in pids if start_ticks(pid) is not None] == [], "no process outlives down"
    assert all(_refused(host, port) for host, port in addresses), "no pod port is left"
    for port in service_ports:
        assert _refused("127.0.0.1", port), "no Service port is left"
        with socket.socket() as sock:
            # Free again: with SO_REUSEADDR a bind fails only while something listens.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    assert not settings_for(solo_region).processes_dir.exists()
