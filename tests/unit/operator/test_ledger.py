"""The ledger: each replica's stance relative to one snapshot, and the deployment's counts."""

from __future__ import annotations

from datetime import datetime

from hotload.api import LoadPath, ReplicaRecord, ReplicaState
from hotload.api.policy_snapshot import Corroboration
from hotload.operator.corroboration import corroborate
from hotload.operator.ledger import (
    count_fleet,
    fold_ledger,
    ledger_entry,
    ledger_patch,
    parse_ledger,
)
from hotload.operator.pods import PodReport
from tests.unit.operator.builders import T0, at, pod

ORDERS = {"s0": (0, 1), "s1": (1, 0), "s2": (2, 0)}


def order_of(identity: str | None) -> tuple[int, int] | None:
    return ORDERS.get(identity or "")


def record(
    state: ReplicaState,
    snapshot: str | None = None,
    since: datetime | None = None,
    via: str | None = None,
    reason: str | None = None,
    message: str | None = None,
) -> ReplicaRecord:
    """A ledger entry, positionally (a Ready one believed on its standing report)."""
    return ReplicaRecord(
        state=state,
        snapshot=snapshot,
        since=since,
        via=LoadPath(via) if via else None,
        reason=reason,
        message=message,
        corroboration=Corroboration.STOOD if state is ReplicaState.READY else None,
    )


def entry(p: PodReport, identity: str, recorded: ReplicaRecord | None = None) -> ReplicaRecord:
    believed = corroborate([p], {}, at(60)).of(p)
    return ledger_entry(p, ORDERS[identity], order_of, recorded, at(60), corroboration=believed)


def test_replica_at_the_snapshot_is_ready_since_it_said_so() -> None:
    e = entry(pod(0, "s1", since=at(5), via="delta"), "s1")
    assert e == record(ReplicaState.READY, "s1", at(5), "delta")


def test_replica_past_the_snapshot_counts_as_ready_and_says_what_it_serves() -> None:
    e = entry(pod(0, "s2", via="delta"), "s1")
    assert (e.state, e.snapshot) == (ReplicaState.READY, "s2")


def test_replica_serving_a_newer_snapshot_while_loading_is_still_ready_here() -> None:
    loading = pod(0, "s1", target="s2", state=ReplicaState.LOADING, since=at(30))
    e = entry(loading, "s1")
    assert e.state is ReplicaState.READY
    assert e.since == at(60)  # when the operator saw it (its own since is the new load's)


def test_failed_replica_carries_reason_and_message() -> None:
    failed = pod(
        0, "s0", target="s1", state=ReplicaState.FAILED, reason="EngineRejected", message="no"
    )
    e = entry(failed, "s1")
    assert (e.state, e.snapshot, e.reason, e.message) == (
        ReplicaState.FAILED, "s0", "EngineRejected", "no",
    )  # fmt: skip


def test_new_pod_without_a_report_is_loading_since_its_creation() -> None:
    fresh = pod(0)
    fresh = PodReport(**{**fresh.__dict__, "since": None})
    e = entry(fresh, "s1")
    assert (e.state, e.snapshot, e.since) == (ReplicaState.LOADING, None, T0)


def test_unchanged_stance_keeps_the_recorded_entry_so_nothing_is_written() -> None:
    recorded = record(ReplicaState.READY, "s1", at(1), "delta")
    again = entry(pod(0, "s1", since=at(9), via="delta"), "s1", recorded)
    assert again is recorded
    assert ledger_patch({"demo-0": recorded}, {"demo-0": again}) == {}


def test_unknown_served_snapshot_is_not_counted_as_ready() -> None:
    e = entry(pod(0, "gone", target="s1", state=ReplicaState.LOADING), "s1")
    assert e.state is ReplicaState.LOADING


def test_fold_counts_ready_and_patch_names_changes_and_removals() -> None:
    pods = [pod(0, "s1"), pod(1, "s0", target="s1", state=ReplicaState.LOADING)]
    fold = fold_ledger(
        pods, ORDERS["s1"], order_of, {}, at(60),
        corroborations=corroborate(pods, {}, at(60)).by_pod,
    )  # fmt: skip
    assert fold.ready == 1
    stale = record(ReplicaState.LOADING, None, T0)
    patch = ledger_patch({"demo-0": stale, "demo-7": stale}, fold.entries)
    assert patch["demo-7"] is None
    assert patch["demo-0"] == {
        "state": "Ready", "snapshot": "s1", "since": "2026-11-23T10:00:00Z", "via": "full",
        "reason": None, "message": None, "digest": None, "corroboration": "Stood",
    }  # fmt: skip
    assert patch["demo-1"]["state"] == "Loading" and patch["demo-1"]["via"] is None


def test_entry_wire_round_trip() -> None:
    e = record(ReplicaState.FAILED, "s0", at(3), "replay", "DecodeFailed", "bad codec")
    assert parse_ledger({"demo-0": e.to_k8s()}) == {"demo-0": e}
    assert parse_ledger({"demo-0": {"state": "Dancing"}}) == {}


def test_counts_cover_desired_replicas_only() -> None:
    pods = [
        pod(0, "s1"),
        pod(1, "s0", target="s1", state=ReplicaState.LOADING),
        pod(2, state=ReplicaState.FAILED, target="s1", reason="EngineRejected", verified=False),
        pod(3, "s1"),  # ordinal 3: scaled away, still terminating
        pod(4, "s1", terminating=True),
    ]
    counts = count_fleet(pods, replicas=3, target="s1")
    assert counts.replicas == 4  # existing, not terminating
    assert (counts.ready, counts.updated, counts.desired) == (2, 1, 3)
    assert counts.by_state == {"Failed": 1, "Loading": 1, "Ready": 1}
    assert counts.by_snapshot == {"s0": 1, "s1": 1}


def test_pods_without_a_state_count_as_pending() -> None:
    counts = count_fleet([pod(0)], replicas=1, target=None)
    assert counts.by_state == {"Pending": 1} and counts.updated == 0
