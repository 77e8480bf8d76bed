"""Peering: the chart's two operator replicas, one active; the other takes over.

Would catch: a standby that never resumes (equal priorities, a per-namespace peering
object that does not exist), a new leader that starts from an incomplete view (a ledger
missing replicas, a rollout left half done), a leader that does not withdraw on SIGTERM.
"""

from __future__ import annotations

import httpx
from kubernetes import client as k8s

from hotload.local import LocalRegions
from hotload.local import chart as hotload_chart
from tests.fixtures.cluster import SESSION_CHART
from tests.integration.operator.conftest import Rollout

OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"


def active_operators(core: k8s.CoreV1Api) -> list[str]:
    """Operator pods that reconcile deployments now (their /metrics say so)."""
    active = []
    for pod in core.list_namespaced_pod(SESSION_CHART.namespace,
                                        label_selector=OPERATOR_SELECTOR).items:  # fmt: skip
        if pod.metadata.deletion_timestamp is not None or not pod.status.pod_ip:
            continue
        try:
            text = httpx.get(f"http://{pod.status.pod_ip}:8080/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            if line.startswith("hotload_operator_reconcilers ") and float(line.split()[1]) > 0:
                active.append(pod.metadata.name)
    return active


def test_active_operator_deleted_mid_rollout_the_standby_completes_it(
    rollout: Rollout, operated_regions: LocalRegions
) -> None:
    region = next(r for r in operated_regions.regions if r.name == rollout.region)
    rollout.create(replicas=3)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    leaders = rollout.wait_for("one active operator", lambda: active_operators(rollout.core))
    assert len(leaders) == 1, leaders

    s1 = rollout.publish(1)
    rollout.core.delete_namespaced_pod(leaders[0], SESSION_CHART.namespace)
    rollout.wait_for(
        "another operator active",
        lambda: [name for name in active_operators(rollout.core) if name != leaders[0]],
    )
    rollout.wait_ready(s1.identity)

    ledger = rollout.ledger(s1.identity)
    assert sorted(ledger) == ["fleet-0", "fleet-1", "fleet-2"]
    assert {(e["state"], e["snapshot"]) for e in ledger.values()} == {("Ready", s1.identity)}
    status = rollout.deployment()["status"]
    assert status["targetSnapshot"]["identity"] == s1.identity
    assert status["replicasByState"] == {"Ready": 3}
    assert rollout.condition(rollout.snapshot(s1.identity), "Ready") == ("True", "Rolled")
    # The next tests get the chart's two replicas back.
    hotload_chart.wait_operator([region], SESSION_CHART, timeout_s=240)
