"""The chart's operator Deployment as the pod runtime runs it, like a kubelet would.

helm installed the chart into the session's regions; the Deployment's pods run the real
`hotload operator` with their own pod-bound tokens, the chart's probes decide their
readiness, and the two replicas peer through the chart's ClusterKopfPeering. It would catch
probes on a port or path the operator does not serve, an operator the chart's RBAC starves
(it would never turn Ready, or never reconcile), two replicas both active (equal priorities,
or peering not shared), and a standby that never takes over.
"""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from hotload.local import LocalRegions
from hotload.waiting import wait_until
from tests.fixtures.cluster import SESSION_CHART

pytestmark = pytest.mark.cluster

PEERING = SESSION_CHART.release
OPERATOR_SELECTOR = (
    f"app.kubernetes.io/instance={SESSION_CHART.release},app.kubernetes.io/component=operator"
)
HANDOVER_TIMEOUT_S = 120.0


def _operator_pods(core: k8s.CoreV1Api) -> list[k8s.V1Pod]:
    pods = core.list_namespaced_pod(SESSION_CHART.namespace, label_selector=OPERATOR_SELECTOR)
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def _ready(pod: k8s.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _reconcilers(pod: k8s.V1Pod) -> float | None:
    """The pod's ``hotload_operator_reconcilers`` gauge (None while it does not answer)."""
    try:
        text = httpx.get(f"http://{pod.status.pod_ip}:8080/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "hotload_operator_reconcilers":
            return float(family.samples[0].value)
    return None


def _peers(custom: k8s.CustomObjectsApi) -> dict[str, Any]:
    peering = custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", PEERING)
    return cast(dict[str, Any], peering.get("status") or {})


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


def test_the_two_replicas_peer_with_distinct_priorities(
    operated_regions: LocalRegions, kube_clients: dict[str, k8s.ApiClient], operated_namespace: str
) -> None:
    """kopf keeps peering alive only while some namespace matches its globs (it spawns the
    keep-alive per served namespace, the cluster-wide object once): hence operated_namespace."""
    for region in operated_regions.regions:
        custom = k8s.CustomObjectsApi(kube_clients[region.name])
        names = {p.metadata.name for p in _operator_pods(k8s.CoreV1Api(kube_clients[region.name]))}

        def both_peers(
            custom: k8s.CustomObjectsApi = custom, names: set[str] = names
        ) -> dict[str, Any]:
            found = _peers(custom)
            return found if found.keys() >= names else {}

        peers = wait_until(both_peers, 60)

        assert peers, f"{region.name}: peers {_peers(custom)} lack {names}"
        priorities = [peers[name]["priority"] for name in names]
        assert len(set(priorities)) == len(priorities), f"{region.name}: {peers}"


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
        f"{standby.metadata.name} never took over from {active.metadata.name}"
    )
    # The Deployment replaces the deleted replica, which joins as the new standby.
    assert wait_until(roles, HANDOVER_TIMEOUT_S, interval_s=0.5), "no replacement standby"
