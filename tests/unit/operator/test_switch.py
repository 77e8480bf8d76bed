"""The coordinated switch in the operator's planner: the publisher's decision copied into
the target, the deadline's presumption, aborts going back, the ledger's phases."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from hotload.api import ReplicaState, RolloutDeploymentSpec
from hotload.api.rollout_deployment import RolloutSpec
from hotload.api.switch import (
    StagingTimeoutAction,
    SwitchDecision,
    SwitchMode,
    SwitchPhase,
    switch_time,
)
from hotload.operator.plan import Observation, plan_deployment
from hotload.operator.pods import PodReport
from hotload.operator.switch import SwitchFacts, plan_switch, switch_facts
from tests.unit.operator.builders import T0, at, delta, full, observation, observed_snapshot, pod
from tests.unit.operator.test_plan import apply

COORDINATED = RolloutSpec(switch=SwitchMode.COORDINATED, staging_timeout_seconds=60,
                          lead_milliseconds=2000)  # fmt: skip
ABORTING = COORDINATED.model_copy(update={"on_staging_timeout": StagingTimeoutAction.ABORT})
DEADLINE = at(100)


def coordinated(observed: Observation, rollout: RolloutSpec = COORDINATED) -> Observation:
    spec: RolloutDeploymentSpec = observed.deployment.spec.model_copy(update={"rollout": rollout})
    return replace(observed, deployment=replace(observed.deployment, spec=spec))


def staged(ordinal: int, served: str, target: str) -> PodReport:
    return replace(
        pod(ordinal, served, target=target, state=ReplicaState.LOADING),
        switch_phase=SwitchPhase.STAGED,
    )


def switched(ordinal: int, served: str, phase: SwitchPhase) -> PodReport:
    return replace(pod(ordinal, served), switch_phase=phase)


def fleet_on_s0_with(
    s1_facts: SwitchFacts, pods: list[PodReport], rollout: RolloutSpec = COORDINATED
) -> Observation:
    """s0 rolled out to three replicas; s1 (a delta) applied, with these switch facts."""
    s0 = observed_snapshot(full("s0", 0))
    s1 = observed_snapshot(delta("s1", 1, "s0", switch=s1_facts), created=at(10))
    status = {"targetSnapshot": {"identity": "s0", "step": 0, "kind": "Full",
                                 "kvCachePolicy": "all"}}  # fmt: skip
    return coordinated(observation([s0, s1], pods, status=status), rollout)


def target(observed: Observation) -> dict[str, Any]:
    return dict(observed.deployment.status["targetSnapshot"])


@pytest.mark.parametrize(
    ("facts", "rollout", "now", "decision", "at_", "wake"),
    [
        # Committed by the publisher: that time, whatever the clock says.
        (SwitchFacts(committed_at=at(50), deadline=DEADLINE), COORDINATED, at(200),
         SwitchDecision.COMMITTED, at(50), None),
        # A commit wins over an abort (some region may have switched on it).
        (SwitchFacts(committed_at=at(50), aborted_at=at(40), deadline=DEADLINE), ABORTING,
         at(60), SwitchDecision.COMMITTED, at(50), None),
        (SwitchFacts(aborted_at=at(40), deadline=DEADLINE), COORDINATED, at(60),
         SwitchDecision.ABORTED, None, None),
        # Undecided before the deadline: wait, and look again at the deadline.
        (SwitchFacts(deadline=DEADLINE), COORDINATED, at(99), SwitchDecision.STAGING, None,
         DEADLINE),
        # Undecided at the deadline: presume onStagingTimeout.
        (SwitchFacts(deadline=DEADLINE), COORDINATED, DEADLINE, SwitchDecision.PRESUMED,
         DEADLINE, None),
        (SwitchFacts(deadline=DEADLINE), ABORTING, DEADLINE, SwitchDecision.ABORTED, None, None),
        # Applied by hand (no switch-by): creation + stagingTimeout + lead, the same rule in
        # every region.
        (SwitchFacts(), COORDINATED, at(10), SwitchDecision.STAGING, None, at(62)),
    ],
)  # fmt: skip
def test_switch_decisions(
    facts: SwitchFacts,
    rollout: RolloutSpec,
    now: datetime,
    decision: SwitchDecision,
    at_: datetime | None,
    wake: datetime | None,
) -> None:
    plan = plan_switch(facts, T0, rollout, now)
    assert plan is not None
    assert (plan.decision, plan.at, plan.wake_at) == (decision, at_, wake)


def test_independent_deployments_have_no_switch_whatever_the_annotations_say() -> None:
    assert plan_switch(SwitchFacts(committed_at=at(1)), T0, RolloutSpec(), at(2)) is None


def test_malformed_annotations_are_no_decision() -> None:
    facts = switch_facts({"hotload.dev/switch-at": "soon", "hotload.dev/switch-by": "tomorrow"})
    assert facts == SwitchFacts()
    written = switch_facts({"hotload.dev/switch-at": switch_time(at(1.25))})
    assert written.committed_at == at(1.25)


def test_staging_then_commit_then_switch() -> None:
    # s1 arrives: it is the target at once, without a switch time; with Follow the replicas
    # are told the deadline (they switch then on their own if nothing else comes).
    observed = fleet_on_s0_with(SwitchFacts(deadline=DEADLINE), [pod(i, "s0") for i in range(3)])
    plan = plan_deployment(observed, at(11))
    assert plan.target.target is not None
    assert (plan.target.target.identity, plan.target.target.switch_at) == ("s1", None)
    assert plan.target.target.switch_by == DEADLINE
    assert plan.wake_at == DEADLINE
    observed = apply(observed, plan)
    assert target(observed)["switchBy"] == "2026-11-23T10:01:40.000Z"
    # Two replicas staged, one still fetching: the publisher waits on stagedReplicas.
    pods = [staged(0, "s0", "s1"), staged(1, "s0", "s1"),
            pod(2, "s0", target="s1", state=ReplicaState.LOADING)]  # fmt: skip
    observed = replace(observed, pods=pods)
    plan = plan_deployment(observed, at(12))
    observed = apply(observed, plan)
    s1 = observed.snapshots["s1"].status
    assert s1["stagedReplicas"] == 2 and s1["readyReplicas"] == 0
    assert {key: value for key, value in s1["switch"].items() if value is not None} == {
        "decision": "Staging", "by": "2026-11-23T10:01:40.000Z", "lateReplicas": 0}  # fmt: skip
    assert [s1["replicas"][f"demo-{i}"].get("phase") for i in range(3)] == [
        "Staged", "Staged", None]  # fmt: skip
    assert s1["replicas"]["demo-0"]["state"] == "Loading"
    # The publisher commits: the target gains switchAt (and loses switchBy), said once.
    committed = SwitchFacts(committed_at=at(20.5), deadline=DEADLINE)
    snaps = {**observed.snapshots}
    snaps["s1"] = replace(snaps["s1"], info=replace(snaps["s1"].info, switch=committed))
    observed = replace(observed, snapshots=snaps)
    plan = plan_deployment(observed, at(18.6))
    assert plan.status_material and plan.wake_at is None
    assert [e.reason for e in plan.events] == ["SwitchScheduled"]
    assert "committed by the publisher" in plan.events[0].message
    observed = apply(observed, plan)
    assert target(observed)["switchAt"] == "2026-11-23T10:00:20.500Z"
    assert "switchBy" not in target(observed)
    assert observed.snapshots["s1"].status["switch"]["decision"] == "Committed"
    again = plan_deployment(observed, at(19))
    assert again.events == [] and "targetSnapshot" not in (again.status_patch or {})
    # Two on time, one late: the ledger and the record say so.
    pods = [switched(0, "s1", SwitchPhase.ON_TIME), switched(1, "s1", SwitchPhase.ON_TIME),
            switched(2, "s1", SwitchPhase.LATE)]  # fmt: skip
    observed = replace(observed, pods=pods)
    observed = apply(observed, plan_deployment(observed, at(23)))
    s1 = observed.snapshots["s1"].status
    assert s1["readyReplicas"] == 3 and s1["stagedReplicas"] == 3
    assert s1["switch"]["lateReplicas"] == 1
    assert [s1["replicas"][f"demo-{i}"]["phase"] for i in range(3)] == ["OnTime", "OnTime", "Late"]


def test_no_decision_by_the_deadline_follow_presumes_the_switch_at_the_deadline() -> None:
    pods = [staged(i, "s0", "s1") for i in range(3)]
    observed = apply(
        o := fleet_on_s0_with(SwitchFacts(deadline=DEADLINE), pods), plan_deployment(o, at(11))
    )
    plan = plan_deployment(observed, DEADLINE + timedelta(milliseconds=5))
    assert plan.target.target is not None and plan.target.target.switch_at == DEADLINE
    assert [e.reason for e in plan.events] == ["SwitchScheduled"]
    assert plan.events[0].type.value == "Warning" and "deadline" in plan.events[0].message
    observed = apply(observed, plan)
    assert observed.snapshots["s1"].status["switch"]["decision"] == "Presumed"


def test_no_decision_by_the_deadline_abort_goes_back_and_a_late_commit_still_wins() -> None:
    pods = [staged(i, "s0", "s1") for i in range(3)]
    first = fleet_on_s0_with(SwitchFacts(deadline=DEADLINE), pods, ABORTING)
    plan = plan_deployment(first, at(11))
    # Abort: replicas presume nothing on their own, so they are not told a deadline.
    assert plan.target.target is not None and plan.target.target.switch_by is None
    observed = apply(first, plan)
    plan = plan_deployment(observed, DEADLINE)
    assert plan.target.target is not None and plan.target.target.identity == "s0"
    assert [e.reason for e in plan.events] == ["SwitchAborted"]
    assert "no decision came by the deadline" in plan.events[0].message
    observed = apply(observed, plan)
    assert observed.deployment.status["rollback"]["fromIdentity"] == "s1"
    assert observed.snapshots["s1"].status["switch"]["decision"] == "Aborted"
    # The publisher's commit reached this region after the deadline: some region may have
    # switched on it, so this one follows (late) instead of staying behind for good.
    snaps = {**observed.snapshots}
    late = SwitchFacts(committed_at=at(99), deadline=DEADLINE)
    snaps["s1"] = replace(snaps["s1"], info=replace(snaps["s1"].info, switch=late))
    plan = plan_deployment(replace(observed, snapshots=snaps), at(130))
    assert plan.target.target is not None
    assert (plan.target.target.identity, plan.target.target.switch_at) == ("s1", at(99))
    assert plan.status_patch is not None and plan.status_patch["rollback"] is None


def test_the_publishers_abort_sends_the_target_back_to_what_the_fleet_serves() -> None:
    pods = [staged(i, "s0", "s1") for i in range(3)]
    observed = apply(
        o := fleet_on_s0_with(SwitchFacts(deadline=DEADLINE), pods), plan_deployment(o, at(11))
    )
    snaps = {**observed.snapshots}
    aborted = SwitchFacts(aborted_at=at(40), deadline=DEADLINE)
    snaps["s1"] = replace(snaps["s1"], info=replace(snaps["s1"].info, switch=aborted))
    plan = plan_deployment(replace(observed, snapshots=snaps), at(40.1))
    assert plan.target.target is not None and plan.target.target.identity == "s0"
    assert [e.reason for e in plan.events] == ["SwitchAborted"]
    assert "by the publisher" in plan.events[0].message
    # The next snapshot (a delta on the aborted one) is a target as usual.
    s2 = observed_snapshot(delta("s2", 2, "s1", switch=SwitchFacts(deadline=at(300))))
    observed = apply(replace(observed, snapshots=snaps), plan)
    plan = plan_deployment(replace(observed, snapshots={**observed.snapshots, "s2": s2}), at(41))
    assert plan.target.target is not None and plan.target.target.identity == "s2"


def test_independent_targets_carry_no_switch_and_ledgers_no_phase() -> None:
    pods = [staged(i, "s0", "s1") for i in range(3)]
    observed = fleet_on_s0_with(
        SwitchFacts(committed_at=at(20), deadline=DEADLINE), pods, RolloutSpec()
    )
    plan = plan_deployment(observed, at(30))
    assert plan.target.target is not None and plan.target.target.switch_at is None
    assert [e.reason for e in plan.events if e.kind == "RolloutDeployment"] == ["TargetMoved"]
    s1 = plan.snapshot_patches["s1"]
    assert "switch" not in s1 and "stagedReplicas" not in s1
    assert all("phase" not in entry for entry in s1["replicas"].values())
