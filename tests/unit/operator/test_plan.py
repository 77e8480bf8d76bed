"""The whole reconcile plan: rollouts, fallback to full, scaling, retention, Events."""

from __future__ import annotations

from typing import Any

import pytest

from hotload.api import KvCachePolicy, ReplicaState, SnapshotRef
from hotload.operator.plan import DeploymentPlan, Observation, plan_deployment
from hotload.operator.retention import plan_retention
from hotload.operator.rollout import SnapshotInfo
from hotload.operator.snapshot_status import ObservedSnapshot
from tests.unit.operator.builders import (
    at,
    by_identity,
    ckpt,
    delta,
    full,
    observation,
    observed_snapshot,
    pod,
)


def apply(observed: Observation, plan: DeploymentPlan) -> Observation:
    """What the apiserver holds after the plan's writes (merge patches applied)."""
    status = _merge(dict(observed.deployment.status), plan.status_patch or {})
    snapshots: dict[str, ObservedSnapshot] = {}
    for identity, snap in observed.snapshots.items():
        if identity in dict(plan.deletions):
            continue
        patch = plan.snapshot_patches.get(identity)
        merged = _merge(dict(snap.status), patch) if patch else dict(snap.status)
        info = snap.info
        chain = next((c for c in merged.get("conditions", []) if c["type"] == "ChainValid"), None)
        if chain is not None:
            from hotload.api import ConditionStatus
            from hotload.operator.rollout import ChainVerdict

            info = SnapshotInfo(
                **{**info.__dict__, "recorded": ChainVerdict(
                    ConditionStatus(chain["status"]), chain["reason"], chain["message"])}
            )  # fmt: skip
        snapshots[identity] = observed_snapshot(info, merged, snap.created or at(0))
    deployment = observed.deployment.__class__(**{**observed.deployment.__dict__, "status": status})
    return Observation(deployment, observed.pods, snapshots)


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def target_of(observed: Observation) -> str | None:
    target = observed.deployment.status.get("targetSnapshot")
    return target["identity"] if target else None


def condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == kind)
    return found["status"], found["reason"]


def test_full_then_deltas_roll_out_and_each_turns_ready() -> None:
    snaps = [observed_snapshot(full("s0", 0))]
    observed = observation(snaps, [pod(i) for i in range(3)])
    plan = plan_deployment(observed, at(1))
    assert plan.target.target is not None and plan.target.target.identity == "s0"
    assert [e.reason for e in plan.events] == ["TargetMoved"]
    observed = apply(observed, plan)
    observed = observation(observed.snapshots.values(), [pod(i, "s0") for i in range(3)],
                           status=observed.deployment.status)  # fmt: skip
    plan = plan_deployment(observed, at(2))
    assert plan.propagated == [("s0", 2.0)]
    observed = apply(observed, plan)
    s0 = observed.snapshots["s0"].status
    assert condition(s0, "Ready") == ("True", "Rolled") and s0["replicasSummary"] == "3/3"
    assert condition(dict(observed.deployment.status), "SnapshotReady") == ("True", "Rolled")
    assert observed.deployment.status["currentSnapshot"]["identity"] == "s0"


def test_corrupt_delta_falls_back_and_the_next_full_clears_it() -> None:
    infos = [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1")]
    snaps = [observed_snapshot(i) for i in infos]
    status = {"targetSnapshot": {"identity": "s2", "step": 2, "kind": "Incremental",
                                 "kvCachePolicy": "all"}}  # fmt: skip
    failing = pod(
        0, "s1", target="s2", state=ReplicaState.FAILED, reason="ChecksumMismatch",
        message="sha256 differs", failed_snapshot="s2",
    )  # fmt: skip
    observed = observation(snaps, [failing, pod(1, "s1", target="s2",
                           state=ReplicaState.LOADING)], replicas=2, status=status)  # fmt: skip
    plan = plan_deployment(observed, at(5))
    assert plan.target.target is not None and plan.target.target.identity == "s1"
    assert plan.verdicts["s2"].broken
    reasons = sorted(e.reason for e in plan.events)
    assert reasons == [
        "ChecksumMismatch", "ChecksumMismatch", "Rolled", "Superseded", "TargetRolledBack",
    ]  # fmt: skip
    observed = apply(observed, plan)
    assert condition(dict(observed.deployment.status), "Degraded") == ("True", "ChecksumMismatch")
    assert observed.snapshots["s2"].status["phase"] == "Failed"

    # The pods moved back to s1; the break stays recorded and Degraded stays.
    observed = observation(observed.snapshots.values(), [pod(0, "s1"), pod(1, "s1")],
                           replicas=2, status=observed.deployment.status)  # fmt: skip
    plan = plan_deployment(observed, at(6))
    assert plan.target.target is not None and plan.target.target.identity == "s1"
    observed = apply(observed, plan)
    assert condition(dict(observed.deployment.status), "Degraded")[0] == "True"

    # A delta on top of the broken one stays off-target; the next Full resets the chain.
    snaps = [*observed.snapshots.values(), observed_snapshot(delta("s3", 3, "s2")),
             observed_snapshot(full("s4", 4))]  # fmt: skip
    observed = observation(snaps, observed.pods, replicas=2, status=observed.deployment.status)
    plan = plan_deployment(observed, at(7))
    assert plan.verdicts["s3"].broken
    assert plan.target.target is not None and plan.target.target.identity == "s4"
    assert "Recovered" in [e.reason for e in plan.events]
    observed = apply(observed, plan)
    observed = observation(observed.snapshots.values(), [pod(0, "s4"), pod(1, "s4")],
                           replicas=2, status=observed.deployment.status)  # fmt: skip
    plan = plan_deployment(observed, at(8))
    observed = apply(observed, plan)
    assert condition(dict(observed.deployment.status), "Degraded") == ("False", "Healthy")
    assert condition(observed.snapshots["s4"].status, "Ready") == ("True", "Rolled")


def test_staging_only_failure_with_a_transient_or_replica_reason_marks_no_chain() -> None:
    snaps = [observed_snapshot(full("s0", 0)), observed_snapshot(delta("s1", 1, "s0"))]
    status = {"targetSnapshot": {"identity": "s1", "step": 1, "kind": "Incremental",
                                 "kvCachePolicy": "all"}}  # fmt: skip
    rejected = pod(0, "s0", target="s1", state=ReplicaState.FAILED, reason="EngineRejected")
    plan = plan_deployment(observation(snaps, [rejected], replicas=1, status=status), at(1))
    assert plan.verdicts["s1"].valid
    assert plan.target.target is not None and plan.target.target.identity == "s1"


def test_scaling_up_and_down_keeps_the_ledger_exact() -> None:
    snaps = [observed_snapshot(full("s0", 0))]
    observed = observation(snaps, [pod(0, "s0"), pod(1, "s0")], replicas=2)
    observed = apply(observed, plan_deployment(observed, at(1)))
    for replicas, pods in (
        (5, [pod(i, "s0") for i in range(2)] + [pod(i) for i in range(2, 5)]),
        (5, [pod(i, "s0") for i in range(5)]),
        (1, [pod(0, "s0")] + [pod(i, "s0", terminating=True) for i in range(1, 5)]),
    ):
        observed = observation(observed.snapshots.values(), pods, replicas=replicas,
                               status=observed.deployment.status)  # fmt: skip
        observed = apply(observed, plan_deployment(observed, at(2)))
        ledger = observed.snapshots["s0"].status["replicas"]
        assert sorted(ledger) == [f"demo-{i}" for i in range(replicas)]
    assert observed.snapshots["s0"].status["replicasSummary"] == "1/1"
    assert observed.deployment.status["replicas"] == 1


@pytest.mark.parametrize(
    ("infos", "keep", "target", "served", "deleted"),
    [
        pytest.param(
            [full("s0", 0), *[delta(f"s{i}", i, f"s{i - 1}") for i in range(1, 6)]],
            2, "s5", ["s5"], [],
            id="the target's chain back to its Full is kept whatever keepSnapshots says",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"), full("s3", 3),
             delta("s4", 4, "s3")],
            2, "s4", ["s4"], ["s0", "s1", "s2"],
            id="after a new Full the old chain goes",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"), full("s3", 3),
             delta("s4", 4, "s3")],
            2, "s4", ["s4", "s1"], ["s2"],
            id="a lagging replica keeps its chain",
        ),
        pytest.param(
            [full("s0", 0), full("s1", 1), full("s2", 2), full("s3", 3)],
            1, "s1", ["s1"], ["s0"],
            id="snapshots newer than the target are never deleted",
        ),
        pytest.param(
            [full("s0", 0), full("x", 9, deployment="other")],
            1, "s0", [], [],
            id="another deployment's snapshots are not ours to delete",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"),
             delta("s3", 3, "s2", checkpoint=ckpt("s2")),
             delta("s4", 4, "s3", checkpoint=ckpt("s2"))],
            1, "s4", ["s4"], ["s0", "s1"],
            id="a checkpoint's 'of' is the chain's floor: it is kept, everything older goes",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"),
             delta("s3", 3, "s2", checkpoint=ckpt("s2")),
             delta("s4", 4, "s3", checkpoint=ckpt("s2"))],
            1, "s4", ["s4", "s1"], [],
            id="a replica serving a link older than the checkpoint keeps its chain to the Full",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1", checkpoint=ckpt("s1")),
             delta("s3", 3, "s2", checkpoint=ckpt("s1")),
             delta("s4", 4, "s3", checkpoint=ckpt("s3")),
             delta("s5", 5, "s4", checkpoint=ckpt("s3"))],
            1, "s5", ["s5"], ["s0", "s1", "s2"],
            id="the newest checkpoint on the walk is the floor, not an older one it passes",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"),
             delta("s3", 3, "s2", checkpoint=ckpt("s1")),
             delta("s4", 4, "s3", checkpoint=ckpt("s1"))],
            1, "s2", ["s2"], [],
            id="a checkpoint named only after the target stops nothing of the target's chain",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1", checkpoint=ckpt("x1"))],
            1, "s2", ["s2"], [],
            id="a checkpoint of a snapshot not on the walk stops nothing (the Full is kept)",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1", checkpoint=ckpt("s1")),
             full("s3", 3), delta("s4", 4, "s3")],
            1, "s4", ["s4", "s2"], ["s0"],
            id="a lagging replica's walk stops at its own chain's checkpoint",
        ),
    ],
)  # fmt: skip
def test_retention_keeps_exactly_what_a_replica_may_need(
    infos: list[SnapshotInfo], keep: int, target: str, served: list[str], deleted: list[str]
) -> None:
    snapshots = by_identity(*infos)
    ref = snapshots[target].ref(KvCachePolicy.ALL)
    assert plan_retention(snapshots, "demo", keep, ref, served) == deleted


def test_retention_deletes_with_the_uid_and_tells_the_user() -> None:
    infos = [full("s0", 0), full("s1", 1), full("s2", 2)]
    status = {"targetSnapshot": {"identity": "s2", "step": 2, "kind": "Full",
                                 "kvCachePolicy": "all"}}  # fmt: skip
    observed = observation([observed_snapshot(i) for i in infos], [pod(0, "s2")], replicas=1,
                           keep=1, status=status)  # fmt: skip
    plan = plan_deployment(observed, at(1))
    assert plan.deletions == [("s0", "uid-s0"), ("s1", "uid-s1")]
    assert [e.reason for e in plan.events].count("SnapshotRetired") == 2
    assert "s0" not in plan.snapshot_patches


def _target(identity: str, step: int, kind: str = "Full") -> dict[str, Any]:
    return {"identity": identity, "step": step, "kind": kind, "kvCachePolicy": "all"}


def test_a_deleted_target_is_held_by_its_finalizer_and_the_fleet_is_not_rolled_back() -> None:
    """Would catch: ``kubectl delete psnap`` of the served target rolling the fleet back
    (finding 4), a held deletion announced on every reconcile, a finalizer left behind."""
    from hotload.api.labels import SERVED_FINALIZER

    # The target gets its guard in the same plan that moves the target onto it.
    observed = observation([observed_snapshot(full("s0", 0))], [pod(i) for i in range(2)],
                           replicas=2)  # fmt: skip
    plan = plan_deployment(observed, at(1))
    assert plan.metadata_patches == {"s0": {"finalizers": [SERVED_FINALIZER]}}

    status = {"targetSnapshot": _target("s1", 1)}
    deleted = observed_snapshot(
        full("s1", 1, deleting=True), finalizers=(SERVED_FINALIZER,)
    )  # the user deleted the target every replica serves
    snaps = [observed_snapshot(full("s0", 0)), deleted]
    observed = observation(snaps, [pod(i, "s1") for i in range(2)], replicas=2, status=status)
    plan = plan_deployment(observed, at(2))
    assert plan.target.target is not None and plan.target.target.identity == "s1"
    assert [e.reason for e in plan.events if e.reason == "DeletionHeld"] == ["DeletionHeld"]
    assert list(plan.metadata_patches["s1"]) == ["annotations"]  # said once, recorded
    assert "s1" not in dict(plan.deletions)
    announced = observed_snapshot(
        full("s1", 1, deleting=True), finalizers=(SERVED_FINALIZER,), announced=True
    )
    observed = observation([snaps[0], announced], observed.pods, replicas=2, status=status)
    plan = plan_deployment(observed, at(3))
    assert "DeletionHeld" not in [e.reason for e in plan.events]
    assert "s1" not in plan.metadata_patches

    # A newer snapshot is published: the target never moves onto nor stays for a deleted
    # one once something newer is valid, and the deletion completes when nobody serves it.
    snaps = [snaps[0], announced, observed_snapshot(full("s2", 2))]
    observed = observation(snaps, [pod(i, "s2") for i in range(2)], replicas=2,
                           status={"targetSnapshot": _target("s2", 2)})  # fmt: skip
    plan = plan_deployment(observed, at(4))
    assert plan.metadata_patches["s1"] == {"finalizers": []}


def test_a_target_edited_by_another_writer_is_repaired_and_said_so() -> None:
    """Would catch: a hand edit of one field (or a move back) repaired silently or passed
    off as the operator's own move."""
    snaps = [observed_snapshot(full("s0", 0)), observed_snapshot(delta("s1", 1, "s0"))]
    ours = SnapshotRef.model_validate(_target("s1", 1, "Incremental"))
    edited = {"targetSnapshot": _target("s1", 7, "Incremental")}
    plan = plan_deployment(
        observation(snaps, [pod(0, "s1")], replicas=1, status=edited, written_target=ours),
        at(1),
    )
    assert plan.target.target == ours
    repairs = [e for e in plan.events if e.reason.startswith("Target")]
    assert [e.reason for e in repairs] == ["TargetRepaired"]
    assert "step 7" in repairs[0].message

    back = {"targetSnapshot": _target("s0", 0)}
    plan = plan_deployment(
        observation(snaps, [pod(0, "s1")], replicas=1, status=back, written_target=ours),
        at(2),
    )
    assert plan.target.target == ours
    assert [e.reason for e in plan.events if e.reason.startswith("Target")] == ["TargetRepaired"]
    assert plan.status_patch is not None and "rollback" not in plan.status_patch


def test_a_backward_move_of_ours_is_recorded_and_the_next_forward_move_clears_it() -> None:
    """Would catch: a legitimate fallback the sidecars cannot tell from a hand edit (they
    follow a backward target only when the rollback record names it)."""
    snaps = [observed_snapshot(full("s0", 0)), observed_snapshot(delta("s1", 1, "s0"))]
    status = {"targetSnapshot": _target("s1", 1, "Incremental")}
    failing = pod(0, "s0", target="s1", state=ReplicaState.FAILED, reason="DecodeFailed",
                  failed_snapshot="s1")  # fmt: skip
    plan = plan_deployment(observation(snaps, [failing], replicas=1, status=status), at(5))
    assert plan.status_patch is not None
    assert plan.status_patch["rollback"] == {
        "fromIdentity": "s1", "toIdentity": "s0", "at": "2026-11-23T10:00:05.000Z",
    }  # fmt: skip
    status = {"targetSnapshot": _target("s0", 0), "rollback": plan.status_patch["rollback"]}
    snaps = [*snaps, observed_snapshot(full("s2", 2))]
    plan = plan_deployment(observation(snaps, [pod(0, "s0")], replicas=1, status=status), at(6))
    assert plan.target.target is not None and plan.target.target.identity == "s2"
    assert plan.status_patch is not None and plan.status_patch["rollback"] is None
