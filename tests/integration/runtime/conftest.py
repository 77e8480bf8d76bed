"""Fixtures of the pod runtime's integration tests: a region, its API, waiting helpers."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import pytest
from kubernetes import client as k8s

from hotload.local import LocalRegions, Region
from hotload.waiting import wait_until

T = TypeVar("T")
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.2
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    last = wait_until(probe, timeout, interval_s=every)
    if last:
        return last
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def read_pod(core: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as JSON (None when it does not exist)."""
    try:
        response = core.read_namespaced_pod(name, namespace, _preload_content=False)
    except k8s.ApiException as err:
        if err.status == 404:
            return None
        raise
    return cast(dict[str, Any], json.loads(response.data))


def condition(pod: dict[str, Any], kind: str) -> str | None:
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return str(entry.get("status"))
    return None


def container_status(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for entry in (pod.get("status") or {}).get("containerStatuses") or []:
        if entry.get("name") == name:
            return cast(dict[str, Any], entry)
    return {}


def set_gate(core: k8s.CoreV1Api, namespace: str, name: str, status: str, kind: str) -> None:
    """Set a readiness-gate condition the way the sidecar does (strategic merge of status)."""
    body = {
        "status": {
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": "TestSaysSo",
                    "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            ]
        }
    }
    core.patch_namespaced_pod_status(name, namespace, body)


@pytest.fixture(scope="module")
def region(local_regions: LocalRegions) -> Region:
    return local_regions.regions[0]


@pytest.fixture(scope="module")
def core(kube_clients: dict[str, k8s.ApiClient], region: Region) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_clients[region.name])


@pytest.fixture(scope="module")
def module_namespace(request: pytest.FixtureRequest, core: k8s.CoreV1Api) -> Iterator[str]:
    """A namespace for one test module (its pods are shared by the module's tests)."""
    module = request.module.__name__.rsplit(".", 1)[-1][5:25].replace("_", "-")
    name = f"rt-{module}-{secrets.token_hex(3)}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


def container_logs(region: Region, namespace: str, pod: str, lines: int = 15) -> str:
    """The tail of every container log of a pod the runtime runs (for failure messages)."""
    parts = []
    for log in sorted(
        (region.directory / "runtime" / "pods").glob(f"{namespace}_{pod}_*/logs/*.log")
    ):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"== {log.parent.parent.name}/{log.name}\n" + "\n".join(tail))
    return "\n".join(parts) or f"(no logs for {namespace}/{pod})"
