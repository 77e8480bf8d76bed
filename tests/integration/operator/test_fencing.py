"""Fencing, against the chart's two operator replicas: freeze the leader, let the standby
take over, resume the frozen one — at each phase of a rollout — and kill it outright.

The leader is frozen with SIGSTOP (its process keeps its view, its in-flight requests and
its belief that it leads) and resumed with SIGCONT after the standby took over and
finished the rollout. Whatever it then tries must not reach the cluster: the statuses the
new leader wrote stay exactly as they are, no Event comes from the resumed replica, and
each move is announced once or, at worst, twice.

Would catch (issue 22, findings 2 and 5): a resumed leader rewriting a latched, finished
PolicySnapshot record or the deployment's status, leadership flapping back to it, a move
never announced, and a killed leader that comes back (same pod, same priority) as the
leader while the live standby never acts.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client as k8s

from hotload.local import LocalRegions
from hotload.local import chart as hotload_chart
from hotload.waiting import wait_until
from tests.fixtures.cluster import SESSION_CHART
from tests.integration.operator.conftest import Rollout
from tests.integration.operator.fault_operators import (
    OperatorReplica,
    decisions,
    frozen,
    kill,
    leader,
    settled_decisions,
)

#: A takeover waits for the Lease to run out (10 s) and lists the world afresh.
TAKEOVER_TIMEOUT_S = 60.0
#: How long a resumed replica is watched for writes it must not make.
RESUMED_WATCH_S = 6.0


def _events(core: k8s.CoreV1Api, namespace: str) -> list[k8s.CoreV1Event]:
    return list(core.list_namespaced_event(namespace).items)


def _moves_announced(events: list[k8s.CoreV1Event], identity: str) -> int:
    return sum(
        1 for e in events if e.reason == "TargetMoved" and f"target is now {identity} " in e.message
    )


def _current_leader(rollout: Rollout, besides: str | None = None) -> OperatorReplica:
    found = wait_until(
        lambda: leader(rollout.core, besides=besides), TAKEOVER_TIMEOUT_S, interval_s=0.2
    )
    assert found is not None, f"no single active operator (besides {besides})"
    return found


def _resume_changes_nothing(
    rollout: Rollout, custom: k8s.CustomObjectsApi, stale: OperatorReplica, settled: Any
) -> None:
    """After SIGCONT: the statuses stay what the new leader wrote, no Event from ``stale``."""
    before = {e.metadata.name for e in _events(rollout.core, rollout.namespace)}
    time.sleep(RESUMED_WATCH_S)
    assert decisions(custom, rollout.namespace) == settled, "a resumed leader wrote a decision"
    late = [
        (e.reason, e.message)
        for e in _events(rollout.core, rollout.namespace)
        if e.metadata.name not in before and e.source and e.source.host == stale.name
    ]
    assert late == [], f"the resumed {stale.name} emitted Events: {late}"
    current = leader(rollout.core)
    assert current is not None and current.name != stale.name, "leadership went back"


def test_a_leader_frozen_at_each_phase_and_resumed_cannot_write_and_moves_are_announced(
    rollout: Rollout, operated_regions: LocalRegions, kube_clients: dict[str, k8s.ApiClient]
) -> None:
    custom = k8s.CustomObjectsApi(kube_clients[rollout.region])
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    takeovers: list[float] = []

    # Phase 1, before the target moves: frozen with a snapshot about to be applied.
    first = _current_leader(rollout)
    with frozen(first) as since:
        s1 = rollout.publish(1)
        second = _current_leader(rollout, besides=first.name)
        takeovers.append(time.monotonic() - since)
        rollout.wait_ready(s1.identity)
        settled = settled_decisions(custom, rollout.namespace)
    _resume_changes_nothing(rollout, custom, first, settled)

    # Phase 2, mid-aggregation: frozen as soon as the target moved, replicas still loading.
    s2 = rollout.prepare(2)
    rollout.apply(s2.policy_snapshot(rollout.name))
    rollout.wait_for(f"target {s2.identity}", lambda: rollout.target() == s2.identity,
                     timeout_s=30)  # fmt: skip
    with frozen(second) as since:
        third = _current_leader(rollout, besides=second.name)
        takeovers.append(time.monotonic() - since)
        rollout.wait_ready(s2.identity)
        settled = settled_decisions(custom, rollout.namespace)
    _resume_changes_nothing(rollout, custom, second, settled)
    finished = settled[f"policysnapshots/{s1.identity}"]["status"]

    # Phase 3, after the latch: frozen with s2 Ready; the next snapshot rolls out meanwhile
    # and s2's record is finished. The resumed leader's view still has s2 as its live target.
    with frozen(third) as since:
        s3 = rollout.publish(3)
        fourth = _current_leader(rollout, besides=third.name)
        takeovers.append(time.monotonic() - since)
        rollout.wait_ready(s3.identity)
        rollout.wait_for(
            f"{s2.identity} sealed",
            lambda: bool(rollout.snapshot(s2.identity)["status"].get("sealedAt")),
            timeout_s=30,
        )
        settled = settled_decisions(custom, rollout.namespace)
    _resume_changes_nothing(rollout, custom, third, settled)
    assert fourth.name != third.name

    # Finished records stay as they were written; each move was announced once or twice.
    assert decisions(custom, rollout.namespace)[f"policysnapshots/{s1.identity}"]["status"] == (
        finished
    )
    for snapshot in (s2, s3):
        record = rollout.snapshot(snapshot.identity)["status"]
        assert rollout.condition({"status": record}, "Ready")[0] == "True", snapshot.identity
        assert {e["state"] for e in record["replicas"].values()} == {"Ready"}
        assert record["readyReplicas"] == record["desiredReplicas"] == 2
    events = _events(rollout.core, rollout.namespace)
    for snapshot in (s1, s2, s3):
        assert 1 <= _moves_announced(events, snapshot.identity) <= 2, snapshot.identity
    print(f"takeover after SIGSTOP of the leader: {[round(t, 1) for t in takeovers]} s")
    region = next(r for r in operated_regions.regions if r.name == rollout.region)
    hotload_chart.wait_operator([region], SESSION_CHART, timeout_s=240)


def test_a_killed_leader_restarted_in_the_same_pod_yields_to_the_live_standby(
    rollout: Rollout, operated_regions: LocalRegions
) -> None:
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    killed = _current_leader(rollout)
    kill(killed)
    took_over = _current_leader(rollout, besides=killed.name)
    # The killed replica's container is back (same pod, same UID) and stays the standby,
    # while the new leader rolls out what comes next.
    region = next(r for r in operated_regions.regions if r.name == rollout.region)
    hotload_chart.wait_operator([region], SESSION_CHART, timeout_s=240)
    s1 = rollout.publish(1)
    rollout.wait_ready(s1.identity)
    now = leader(rollout.core)
    assert now is not None and now.name == took_over.name, (killed.name, took_over.name, now)
