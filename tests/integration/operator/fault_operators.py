"""The chart's operator replicas as a fault injector sees them: who leads, its process, and
freezing it (SIGSTOP/SIGCONT) or killing it (SIGKILL; the pod runtime restarts it).

Who leads is read from each replica's ``hotload_operator_reconcilers`` gauge (non-zero on
the one replica that reconciles), which every version of the operator serves; the
process is the container's, from the pod's ``containerID`` (``hotload://<pid>``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.cluster import SESSION_CHART

OPERATOR_SELECTOR = (
    f"app.kubernetes.io/instance={SESSION_CHART.release},app.kubernetes.io/component=operator"
)


@dataclass(frozen=True)
class OperatorReplica:
    name: str
    ip: str
    pid: int


def replicas(core: k8s.CoreV1Api) -> list[OperatorReplica]:
    """The live operator pods whose container runs."""
    found = []
    pods = core.list_namespaced_pod(SESSION_CHART.namespace, label_selector=OPERATOR_SELECTOR)
    for pod in pods.items:
        if pod.metadata.deletion_timestamp is not None or not pod.status.pod_ip:
            continue
        for status in pod.status.container_statuses or ():
            if status.container_id and status.state and status.state.running:
                pid = int(status.container_id.rsplit("/", 1)[-1])
                found.append(OperatorReplica(pod.metadata.name, pod.status.pod_ip, pid))
    return found


def reconciling(replica: OperatorReplica) -> float | None:
    """The replica's ``hotload_operator_reconcilers`` gauge (None: it does not answer)."""
    try:
        text = httpx.get(f"http://{replica.ip}:8080/metrics", timeout=1.5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "hotload_operator_reconcilers":
            return float(family.samples[0].value)
    return None


def leader(core: k8s.CoreV1Api, *, besides: str | None = None) -> OperatorReplica | None:
    """The one replica that reconciles (other than ``besides``), None while that is unclear."""
    active = [
        r for r in replicas(core) if r.name != besides and (reconciling(r) or 0) > 0
    ]  # a frozen replica does not answer: it is not counted
    return active[0] if len(active) == 1 else None


@contextlib.contextmanager
def frozen(replica: OperatorReplica) -> Iterator[float]:
    """SIGSTOP the replica's process group for the block (yields the monotonic time it
    froze); SIGCONT always follows, whatever the block raised."""
    os.killpg(replica.pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        os.killpg(replica.pid, signal.SIGCONT)


def kill(replica: OperatorReplica) -> None:
    """SIGKILL the replica's process group (the pod runtime restarts the container)."""
    os.killpg(replica.pid, signal.SIGKILL)


def decisions(custom: k8s.CustomObjectsApi, namespace: str) -> dict[str, Any]:
    """Everything the operator decides in a namespace: each deployment's and each
    snapshot's status and finalizers, with the object's resourceVersion (any write moves it),
    by kind and name."""
    out: dict[str, Any] = {}
    for plural in ("rolloutdeployments", "policysnapshots"):
        listed = custom.list_namespaced_custom_object("hotload.dev", "v1alpha1", namespace, plural)
        for item in listed.get("items") or []:
            metadata = item["metadata"]
            out[f"{plural}/{metadata['name']}"] = {
                "resourceVersion": metadata.get("resourceVersion"),
                "finalizers": metadata.get("finalizers"),
                "status": item.get("status") or {},
            }
    return out


def settled_decisions(
    custom: k8s.CustomObjectsApi, namespace: str, quiet_s: float = 6.0, timeout_s: float = 60.0
) -> dict[str, Any]:
    """The decisions once nothing has changed for ``quiet_s`` (a leader coalesces count-only
    writes for 5 s): what a resumed replica must leave exactly as it is."""
    deadline = time.monotonic() + timeout_s
    last = decisions(custom, namespace)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = decisions(custom, namespace)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return now
    raise AssertionError(f"the operator's decisions never settled in {namespace}")
