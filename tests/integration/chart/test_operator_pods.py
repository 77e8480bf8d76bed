"""The chart's operator Deployment as the pod runtime runs it, like a kubelet would.

helm installed the chart into the session's regions; the Deployment's pods run the real
`hotload operator` with their own pod-bound tokens, the chart's probes decide their
readiness, and the two replicas elect one leader through the chart's Lease. It would catch
probes on a port or path the operator does not serve, an operator the chart's RBAC starves
(it would never turn Ready, never hold the Lease, or never reconcile), two replicas both
active, and a standby that never takes over.
"""

from __future__ import annotations

import httpx
import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from hotload.local import LocalRegions
from hotload.waiting import wait_until
from tests.fixtures.cluster import SESSION_CHART

pytestmark = pytest.mark.cluster

LEASE = f"{SESSION_CHART.operator_deployment.removesuffix('-operator')}-leader"
OPERATOR_SELECTOR = (
    f"app.kubernetes.io/instance={SESSION_CHART.release},app.kubernetes.io/component=operator"
)
HANDOVER_TIMEOUT_S = 120.0


def _operator_pods(core: k8s.CoreV1Api) -> list[k8s.V1Pod]:
    pods = core.list_namespaced_pod(SESSION_CHART.namespace, label_selector=OPERATOR_SELECTOR)
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def _ready(pod: k8s.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _gauge(pod: k8s.V1Pod, name: str) -> float | None:
    """One of the pod's gauges (None while it does not answer)."""
    try:
        text = httpx.get(f"http://{pod.status.pod_ip}:8080/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return float(family.samples[0].value)
    return None


def _diagnosis(regions: LocalRegions, api: k8s.ApiClient, *pods: k8s.V1Pod) -> str:
    """What a failed handover leaves to read: the Lease, and each pod's health and log."""
    lease = k8s.CoordinationV1Api(api).read_namespaced_lease(LEASE, SESSION_CHART.namespace)
    parts = [f"lease: {lease.spec}"]
    for pod in pods:
        try:
            health = httpx.get(f"http://{pod.status.pod_ip}:8080/healthz", timeout=5).text
        except httpx.HTTPError as err:
            health = repr(err)
        logs = sorted(regions.state_dir.glob(f"*/runtime/pods/*_{pod.metadata.name}_*/logs/*.log"))
        tail = logs[-1].read_text(errors="replace")[-6000:] if logs else "(no log)"
        parts.append(f"--- {pod.metadata.name}: {health}\n{tail}")
    return "\n".join(parts)


def _reconcilers(pod: k8s.V1Pod) -> float | None:
    """The pod's ``hotload_operator_reconcilers`` gauge (0 on a standby)."""
    return _gauge(pod, "hotload_operator_reconcilers")


def test_operator_replicas_turn_ready_through_the_charts_probes(
    operated_regions: LocalRegions, kube_clients: dict[str, k8s.ApiClient]
) -> None:
    for region in operated_regions.regions:
        core = k8s.CoreV1Api(kube_clients[region.name])
        pods = _operator_pods(core)

        assert len(pods) == 2, region.name
        for pod in pods:
            assert _ready(pod), f"{region.name}/{pod.metadata.name}: {pod.status}"
            (container,) = pod.spec.containers
            assert container.command == ["hotload", "operator"]
            assert container.readiness_probe.http_get.path == "/healthz"
            health = httpx.get(f"http://{pod.status.pod_ip}:8080/healthz", timeout=5)
            assert health.status_code == 200, health.text
        assert pods[0].status.pod_ip != pods[1].status.pod_ip


def test_one_replica_holds_the_lease_and_says_so(
    operated_regions: LocalRegions, kube_clients: dict[str, k8s.ApiClient]
) -> None:
    """The Lease names one pod (and that process's incarnation); that pod, and only it,
    reports itself the leader."""
    for region in operated_regions.regions:
        core = k8s.CoreV1Api(kube_clients[region.name])
        coordination = k8s.CoordinationV1Api(kube_clients[region.name])

        def one_leader(
            core: k8s.CoreV1Api = core, coordination: k8s.CoordinationV1Api = coordination
        ) -> tuple[str, dict[str, float | None]] | None:
            holder = coordination.read_namespaced_lease(LEASE, SESSION_CHART.namespace)
            leaders = {p.metadata.name: _gauge(p, "hotload_operator_leader")
                       for p in _operator_pods(core)}  # fmt: skip
            if sorted(leaders.values(), key=str) != [0.0, 1.0]:
                return None
            return str(holder.spec.holder_identity or ""), leaders

        found = wait_until(one_leader, 60)
        assert found, f"{region.name}: no single leader"
        holder, leaders = found
        (leader,) = [name for name, value in leaders.items() if value == 1.0]
        assert holder.startswith(f"{leader}_"), (holder, leaders)


def test_one_replica_reconciles_and_the_standby_takes_over_when_it_goes(
    operated_regions: LocalRegions, kube_clients: dict[str, k8s.ApiClient], idle_deployment: str
) -> None:
    region = operated_regions.regions[-1]
    core = k8s.CoreV1Api(kube_clients[region.name])

    def roles() -> tuple[list[k8s.V1Pod], list[k8s.V1Pod]] | None:
        pods = [p for p in _operator_pods(core) if _ready(p)]
        counts = {p.metadata.name: _reconcilers(p) for p in pods}
        if len(pods) != 2 or None in counts.values():
            return None
        active = [p for p in pods if counts[p.metadata.name]]
        standby = [p for p in pods if not counts[p.metadata.name]]
        return (active, standby) if len(active) == 1 else None

    found = wait_until(roles, HANDOVER_TIMEOUT_S, interval_s=0.5)
    assert found, (
        f"not exactly one active replica: {[_reconcilers(p) for p in _operator_pods(core)]}"
    )
    (active,), (standby,) = found

    core.delete_namespaced_pod(active.metadata.name, SESSION_CHART.namespace)

    def standby_active() -> bool:
        return bool(_reconcilers(standby))

    assert wait_until(standby_active, HANDOVER_TIMEOUT_S, interval_s=0.5), (
        f"{standby.metadata.name} never took over from {active.metadata.name}\n"
        + _diagnosis(operated_regions, kube_clients[region.name], standby, active)
    )
    # The Deployment replaces the deleted replica, which joins as the new standby.
    assert wait_until(roles, HANDOVER_TIMEOUT_S, interval_s=0.5), "no replacement standby"
