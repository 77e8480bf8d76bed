"""Snapshot and deployment statuses computed whole from the observed state."""

from __future__ import annotations

from typing import Any

from hotload.api import ConditionStatus, KvCachePolicy, ReplicaState, SnapshotKind, SnapshotRef
from hotload.api.conditions import merge_conditions
from hotload.operator import snapshot_status
from hotload.operator.corroboration import corroborate
from hotload.operator.deployment_status import plan_deployment_status
from hotload.operator.ledger import count_fleet
from hotload.operator.pods import PodReport
from hotload.operator.rollout import ChainVerdict
from tests.unit.operator.builders import at, broken, delta, full, observed_snapshot, pod, valid


def plan_snapshot_status(
    observed: snapshot_status.ObservedSnapshot,
    verdict: ChainVerdict,
    pods: list[PodReport],
    replicas: int,
    target: SnapshotRef | None,
    order_of: Any,
    now: Any,
) -> snapshot_status.SnapshotStatusPlan:
    """The planner with the replicas' reports believed as the deployment's plan does."""
    believed = corroborate(pods, {}, now).by_pod
    return snapshot_status.plan_snapshot_status(
        observed, verdict, pods, replicas, target, order_of, now, corroborations=believed
    )


ORDERS = {"s0": (0, 1), "s1": (1, 0), "s2": (2, 0)}


def order_of(identity: str | None) -> tuple[int, int] | None:
    return ORDERS.get(identity or "")


def ref(identity: str, step: int) -> SnapshotRef:
    kind = SnapshotKind.FULL if step == 0 else SnapshotKind.INCREMENTAL
    return SnapshotRef(identity=identity, step=step, kind=kind, kv_cache_policy=KvCachePolicy.ALL)


def conditions(patch: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in patch["conditions"]}


S1 = delta("s1", 1, "s0")


def test_target_rolling_then_rolled_with_propagation_times() -> None:
    pods = [pod(0, "s1"), pod(1, "s0", target="s1", state=ReplicaState.LOADING)]
    plan = plan_snapshot_status(
        observed_snapshot(S1), valid(), pods, 2, ref("s1", 1), order_of, at(2)
    )
    assert plan.patch is not None
    assert conditions(plan.patch)["Ready"] == ("False", "Rolling")
    assert plan.patch["phase"] == "Rolling" and plan.patch["replicasSummary"] == "1/2"
    assert plan.patch["propagation"] == {
        "targetSetAt": "2026-11-23T10:00:02.000Z",
        "firstReplicaReadyAt": "2026-11-23T10:00:02.000Z",
    }
    # Apply the patch as the apiserver would, then both replicas arrive.
    status = {**plan.patch, "replicas": {k: v for k, v in plan.patch["replicas"].items() if v}}
    done = plan_snapshot_status(
        observed_snapshot(S1, status), valid(), [pod(0, "s1"), pod(1, "s1")], 2,
        ref("s1", 1), order_of, at(3.5),
    )  # fmt: skip
    assert done.patch is not None and done.completed_now
    assert conditions(done.patch)["Ready"] == ("True", "Rolled")
    assert done.patch["phase"] == "Ready" and done.patch["replicasSummary"] == "2/2"
    assert done.patch["propagation"]["allReplicasReadyAt"] == "2026-11-23T10:00:03.500Z"
    assert done.patch["propagation"]["targetSetAt"] == "2026-11-23T10:00:02.000Z"


def test_nothing_changed_means_no_write() -> None:
    first = plan_snapshot_status(
        observed_snapshot(S1), valid(), [pod(0, "s1")], 1, ref("s1", 1), order_of, at(1)
    )
    assert first.patch is not None
    status = {**first.patch, "replicas": first.patch["replicas"]}
    again = plan_snapshot_status(
        observed_snapshot(S1, status), valid(), [pod(0, "s1")], 1, ref("s1", 1), order_of, at(9)
    )
    assert again.patch is None and not again.completed_now


def test_skipped_step_turns_ready_as_superseded() -> None:
    plan = plan_snapshot_status(
        observed_snapshot(S1), valid(), [pod(0, "s2"), pod(1, "s2")], 2, ref("s2", 2),
        order_of, at(1),
    )  # fmt: skip
    assert plan.patch is not None and plan.completed_now
    assert conditions(plan.patch)["Ready"] == ("True", "Superseded")
    assert plan.patch["readyReplicas"] == 2


def test_ready_is_a_latch_and_a_superseded_ledger_is_frozen() -> None:
    latched = plan_snapshot_status(
        observed_snapshot(S1), valid(), [pod(0, "s1")], 1, ref("s1", 1), order_of, at(1)
    ).patch
    assert latched is not None
    status = {**latched}
    # Later: the target moved on and a replica restarted (serves nothing): the record is
    # sealed as it stands, and nothing else is written.
    later = plan_snapshot_status(
        observed_snapshot(S1, status), valid(), [pod(0)], 1, ref("s2", 2), order_of, at(50)
    )
    assert later.patch == {"sealedAt": "2026-11-23T10:00:50.000Z"}
    sealed = {**status, **later.patch}
    assert (
        plan_snapshot_status(
            observed_snapshot(S1, sealed), valid(), [pod(0)], 1, ref("s2", 2), order_of, at(60)
        ).patch
        is None
    )


def test_a_sealed_record_stays_as_it_is_when_a_rollback_makes_it_the_target_again() -> None:
    """Would catch: a finished record rewritten (its ledger, its counts) by the one
    backward move, the return to the last good snapshot."""
    latched = plan_snapshot_status(
        observed_snapshot(S1), valid(), [pod(0, "s1")], 1, ref("s1", 1), order_of, at(1)
    ).patch
    assert latched is not None
    sealed = {**latched, "sealedAt": "2026-11-23T10:00:50.000Z"}
    again = plan_snapshot_status(
        observed_snapshot(S1, sealed), valid(), [pod(0, "s2")], 1, ref("s1", 1), order_of, at(70)
    )
    assert again.patch is None


def test_broken_snapshot_never_turns_ready_and_is_failed() -> None:
    plan = plan_snapshot_status(
        observed_snapshot(S1), broken(), [pod(0, "s2")], 1, ref("s2", 2), order_of, at(1)
    )
    assert plan.patch is not None
    assert conditions(plan.patch) == {
        "ChainValid": ("False", "ChecksumMismatch"),
        "Ready": ("False", "ChainInvalid"),
    }
    assert plan.patch["phase"] == "Failed"


def test_pending_snapshot_waits_for_its_chain_without_a_ledger() -> None:
    unknown = ChainVerdict(ConditionStatus.UNKNOWN, "PreviousMissing", "previous s1 missing")
    plan = plan_snapshot_status(
        observed_snapshot(delta("s2", 2, "s1")), unknown, [pod(0, "s0")], 1, ref("s0", 0),
        order_of, at(1),
    )  # fmt: skip
    assert plan.patch is not None
    assert conditions(plan.patch) == {
        "ChainValid": ("Unknown", "PreviousMissing"),
        "Ready": ("False", "Pending"),
    }
    assert plan.patch["phase"] == "Pending" and "replicas" not in plan.patch


def test_zero_replicas_rolls_the_target_at_once() -> None:
    plan = plan_snapshot_status(
        observed_snapshot(full("s0", 0)), valid(), [], 0, ref("s0", 0), order_of, at(1)
    )
    assert plan.patch is not None and conditions(plan.patch)["Ready"] == ("True", "Rolled")


def test_condition_transition_time_moves_only_when_status_changes() -> None:
    from hotload.api.conditions import DesiredCondition

    first = merge_conditions(
        [], [DesiredCondition("Ready", ConditionStatus.FALSE, "Rolling", "0/2")],
        observed_generation=1, now=at(1),
    )  # fmt: skip
    second = merge_conditions(
        first, [DesiredCondition("Ready", ConditionStatus.FALSE, "Rolling", "1/2")],
        observed_generation=1, now=at(5),
    )  # fmt: skip
    third = merge_conditions(
        second, [DesiredCondition("Ready", ConditionStatus.TRUE, "Rolled", "2/2")],
        observed_generation=1, now=at(9),
    )  # fmt: skip
    assert second[0]["lastTransitionTime"] == "2026-11-23T10:00:01Z"
    assert third[0]["lastTransitionTime"] == "2026-11-23T10:00:09Z"
    assert third[0]["observedGeneration"] == 1


def _deployment(
    pods: list[Any], replicas: int, target: SnapshotRef | None, breaks: list[Any] | None = None
) -> dict[str, tuple[str, str]]:
    counts = count_fleet(pods, replicas, target.identity if target else None)
    desired = [p for p in pods if p.is_desired(replicas)]
    plan = plan_deployment_status({}, 3, "sel", counts, desired, target, None, breaks or [], at(1))
    assert plan.patch is not None
    return conditions(plan.patch)


def test_deployment_conditions_while_rolling_and_when_rolled() -> None:
    rolling = _deployment(
        [pod(0, "s1"), pod(1, "s0", target="s1", state=ReplicaState.LOADING)], 2, ref("s1", 1)
    )
    assert rolling == {
        "Available": ("True", "ReplicasServing"),
        "Progressing": ("True", "Rolling"),
        "SnapshotReady": ("False", "Rolling"),
        "Degraded": ("False", "Healthy"),
    }
    rolled = _deployment([pod(0, "s1"), pod(1, "s1")], 2, ref("s1", 1))
    assert rolled["Progressing"] == ("False", "RolledOut")
    assert rolled["SnapshotReady"] == ("True", "Rolled")


def test_deployment_degraded_by_a_break_ahead_of_the_target() -> None:
    info = delta("s2", 2, "s1")
    got = _deployment([pod(0, "s1")], 1, ref("s1", 1), [(info, broken("DecodeFailed"))])
    assert got["Degraded"] == ("True", "DecodeFailed")


def test_deployment_degraded_by_failed_replicas_and_unavailable_while_none_serve() -> None:
    failed = pod(0, target="s1", state=ReplicaState.FAILED, reason="EngineRejected")
    got = _deployment([failed], 1, ref("s1", 1))
    assert got["Degraded"] == ("True", "ReplicasFailed")
    assert got["Available"] == ("False", "ReplicasUnavailable")


def test_deployment_without_target_and_scaled_to_zero() -> None:
    got = _deployment([], 0, None)
    assert got["Available"] == ("True", "ScaledToZero")
    assert got["Progressing"] == ("False", "NoTarget")


def test_counts_only_change_is_not_material_and_removed_snapshot_keys_are_nulled() -> None:
    target = ref("s1", 1)
    pods = [pod(0, "s1"), pod(1, "s0", target="s1", state=ReplicaState.LOADING)]
    counts = count_fleet(pods, 2, "s1")
    first = plan_deployment_status({}, 3, "sel", counts, pods, target, None, [], at(1))
    assert first.patch is not None and first.material
    recorded = {**first.patch}
    pods2 = [pod(0, "s1"), pod(1, "s1", target="s1", state=ReplicaState.LOADING)]
    counts2 = count_fleet(pods2, 2, "s1")
    second = plan_deployment_status(recorded, 3, "sel", counts2, pods2, target, None, [], at(2))
    assert second.patch is not None and not second.material
    assert second.patch["replicasBySnapshot"] == {"s0": None, "s1": 2}


def test_a_snapshot_of_a_missing_deployment_says_so_once() -> None:
    from hotload.operator.orphans import orphan_status

    body = {"metadata": {"generation": 1}, "spec": {"deploymentRef": {"name": "typo"}}}
    patch = orphan_status(body, at(1))
    assert patch is not None and patch["phase"] == "Pending"
    assert conditions(patch) == {"Ready": ("False", "DeploymentNotFound")}
    assert "typo" in patch["conditions"][0]["message"]
    assert orphan_status({**body, "status": {"phase": "Rolling"}}, at(2)) is None
