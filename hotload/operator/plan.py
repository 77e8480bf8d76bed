"""The whole reconcile of one RolloutDeployment as a pure function: observed in, plan out.

``plan_deployment`` takes everything the reconciler observed (the deployment, its replica
pods, the PolicySnapshots of its namespace) and returns every write that should happen:
the deployment's status, each snapshot's status, the snapshots retention deletes, the
Events a user acts on, and the propagation times completed now. The reconciler only
executes it (``executor.py``); every decision is here, tested with tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from hotload.api import ReplicaState, RolloutDeploymentSpec, SnapshotRef
from hotload.api import reasons as reason_words
from hotload.api.conditions import CHAIN_VALID, DEGRADED, READY
from hotload.api.kinds import Identity
from hotload.api.labels import SERVED_FINALIZER
from hotload.api.policy_snapshot import KIND as SNAPSHOT_KIND
from hotload.api.rollout_deployment import KIND as DEPLOYMENT_KIND
from hotload.operator.corroboration import corroborate
from hotload.operator.deployment_status import plan_deployment_status
from hotload.operator.guards import plan_guards
from hotload.operator.ledger import count_fleet
from hotload.operator.pods import PodReport
from hotload.operator.retention import plan_retention
from hotload.operator.rollout import (
    BreakReport,
    ChainVerdict,
    SnapshotInfo,
    TargetMove,
    TargetPlan,
    breaks_ahead_of,
    plan_target,
    validate_chains,
)
from hotload.operator.snapshot_status import ObservedSnapshot, plan_snapshot_status, precise_time
from hotload.operator.switch import SwitchPlan, plan_switch
from hotload.operator.workload import label_selector


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class EventSpec:
    """A Kubernetes Event to emit about one of our objects."""

    kind: str
    name: str
    uid: str
    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class ObservedDeployment:
    name: str
    namespace: str
    uid: str
    generation: int | None
    spec: RolloutDeploymentSpec
    status: Mapping[str, Any]
    written_target: SnapshotRef | None = None
    """The target this operator wrote last (None: none yet this tenure). A recorded target
    that differs was written by someone else: the move that restores ours is a repair."""


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile looks at."""

    deployment: ObservedDeployment
    pods: Sequence[PodReport]
    """This deployment's replica pods (terminating ones included)."""
    snapshots: Mapping[str, ObservedSnapshot]
    """Every PolicySnapshot of the namespace, by identity."""


@dataclass(frozen=True)
class DeploymentPlan:
    target: TargetPlan
    status_patch: dict[str, Any] | None
    status_material: bool
    snapshot_patches: dict[str, dict[str, Any]] = field(default_factory=dict)
    progress_only: frozenset[str] = frozenset()
    """Snapshots whose patch only records a rollout's progress (not ``material``): their
    writes may wait for the status interval."""
    deletions: list[tuple[str, str]] = field(default_factory=list)
    """(identity, uid) of PolicySnapshots retention deletes."""
    events: list[EventSpec] = field(default_factory=list)
    propagated: list[tuple[str, float]] = field(default_factory=list)
    """(identity, seconds from creation to all replicas ready) completed now."""
    verdicts: dict[str, ChainVerdict] = field(default_factory=dict)
    recheck_at: datetime | None = None
    """When a replica's report not corroborated yet will have stood long enough."""
    metadata_patches: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Identity → a PolicySnapshot's metadata patch (its ``hotload.dev/served`` finalizer;
    written before the target moves onto it)."""
    wake_at: datetime | None = None
    """Plan again at this moment even if nothing is observed meanwhile (the deadline of the
    target's coordinated switch)."""


def recorded_ref(status: Mapping[str, Any], key: str) -> SnapshotRef | None:
    raw = status.get(key)
    if not isinstance(raw, Mapping):
        return None
    try:
        return SnapshotRef.model_validate(raw)
    except ValueError:
        return None


def break_reports(pods: Sequence[PodReport]) -> list[BreakReport]:
    """Chain-breaking failures the replicas report, oldest report first."""
    reports = [
        BreakReport(
            identity=pod.failed_identity or pod.target_identity or "",
            reason=pod.reason or "",
            message=pod.message or "",
            pod=pod.name,
        )
        for pod in sorted(pods, key=lambda p: (p.since is None, p.since, p.name))
        if pod.state is ReplicaState.FAILED
        and pod.reason in reason_words.CHAIN_BREAKING_REASONS
        and (pod.failed_identity or pod.target_identity)
    ]
    return reports


def _current(
    desired: Sequence[PodReport], snapshots: Mapping[str, SnapshotInfo], spec: RolloutDeploymentSpec
) -> SnapshotRef | None:
    """The newest snapshot every serving replica has (the oldest one any of them serves)."""
    served = [
        snapshots[pod.served_identity]
        for pod in desired
        if pod.served_identity and pod.served_identity in snapshots
    ]
    if not served:
        return None
    oldest = min(served, key=lambda info: info.order)
    return oldest.ref(spec.hot_load.kv_cache_policy, with_switch=False)


def _describe(ref: SnapshotRef | None) -> str:
    return "none" if ref is None else f"{ref.identity} (step {ref.step}, {ref.kind.value})"


def _switch_events(
    plan: TargetPlan, deployment: ObservedDeployment, infos: Mapping[str, SnapshotInfo]
) -> list[EventSpec]:
    """The target gained its coordinated switch time: committed, or presumed at the
    deadline (said once, when the switch time first appears)."""
    target, before = plan.target, plan.previous
    if target is None or target.switch_at is None:
        return []
    if before is not None and before.same_snapshot(target) and before.switch_at is not None:
        return []
    info = infos.get(target.identity)
    if info is not None and info.switch.committed_at is not None:
        how, kind = "committed by the publisher", EventType.NORMAL
    else:
        how = "no decision came by the deadline (onStagingTimeout: Follow)"
        kind = EventType.WARNING
    message = (
        f"coordinated switch to {target.identity} (step {target.step}) at "
        f"{precise_time(target.switch_at)}: {how}"
    )
    return [EventSpec(DEPLOYMENT_KIND, deployment.name, deployment.uid, kind,
                      reason_words.SWITCH_SCHEDULED, message)]  # fmt: skip


def _target_events(
    plan: TargetPlan, deployment: ObservedDeployment, infos: Mapping[str, SnapshotInfo]
) -> list[EventSpec]:
    if plan.move is TargetMove.NONE:
        return []
    written = deployment.written_target
    if written is not None and plan.previous is not None and plan.previous != written:
        # Someone else wrote the target (a hand edit of one field, a move back or forward):
        # ours is restored, and that is said, never passed off as a move of ours.
        how = "restored" if plan.target == written else "set"
        message = (
            f"status.targetSnapshot was changed by another writer to {_describe(plan.previous)}"
            f"; {how} to {_describe(plan.target)} (only the operator moves the target)"
        )
        return [EventSpec(DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.WARNING,
                          reason_words.TARGET_REPAIRED, message)]  # fmt: skip
    if plan.move is TargetMove.REFRESH:
        return _switch_events(plan, deployment, infos)
    aborted = infos.get(plan.previous.identity) if plan.previous is not None else None
    if plan.move is TargetMove.BACK and aborted is not None and aborted.aborted:
        was = aborted.identity
        by = (
            "by the publisher"
            if aborted.switch.aborted_at is not None
            else "no decision came by the deadline (onStagingTimeout: Abort)"
        )
        back = plan.target.identity if plan.target is not None else "none"
        message = (
            f"coordinated switch to {was} aborted ({by}): nobody switches to it; the target "
            f"is back to {back}, what the fleet serves"
        )
        return [EventSpec(DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.WARNING,
                          reason_words.SWITCH_ABORTED, message)]  # fmt: skip
    if plan.target is None:
        reason, kind = reason_words.TARGET_CLEARED, EventType.WARNING
        message = f"target {plan.previous.identity if plan.previous else ''} is not a valid " \
            "snapshot of this deployment and nothing valid remains: target cleared"  # fmt: skip
    elif plan.move is TargetMove.BACK:
        reason, kind = reason_words.TARGET_ROLLED_BACK, EventType.WARNING
        was = plan.previous.identity if plan.previous else "none"
        message = (
            f"target {was} is broken or gone: back to {plan.target.identity} "
            f"(step {plan.target.step}), the newest valid snapshot"
        )
    else:
        reason, kind = reason_words.TARGET_MOVED, EventType.NORMAL
        message = (
            f"target is now {plan.target.identity} (step {plan.target.step}, "
            f"{plan.target.kind.value})"
        )
    moved = EventSpec(DEPLOYMENT_KIND, deployment.name, deployment.uid, kind, reason, message)
    return [moved, *_switch_events(plan, deployment, infos)]


def plan_switches(
    observation: Observation, now: datetime
) -> tuple[dict[str, SnapshotInfo], dict[str, SwitchPlan]]:
    """Each snapshot of the deployment with its coordinated switch planned (aborted ones are
    no target; the target's reference carries ``switchAt``/``switchBy``), and the plans."""
    deployment = observation.deployment
    floor = _served_floor(observation)
    infos: dict[str, SnapshotInfo] = {}
    plans: dict[str, SwitchPlan] = {}
    for identity, snap in observation.snapshots.items():
        info = snap.info
        plan = None
        if info.deployment == deployment.name:
            plan = plan_switch(info.switch, snap.created, deployment.spec.rollout, now)
        if plan is not None:
            plans[identity] = plan
            info = replace(
                info,
                # An abort concerns a switch still to come: every replica serving the
                # snapshot already (it was their first load) makes it moot.
                aborted=plan.aborted and (floor is None or info.order > floor),
                switch_at=plan.target_switch_at,
                switch_by=plan.target_switch_by,
            )
        infos[identity] = info
    return infos, plans


def _served_floor(observation: Observation) -> tuple[int, int] | None:
    """The order of the oldest snapshot a desired replica serves; None while one serves
    nothing known."""
    replicas = observation.deployment.spec.replicas
    orders = []
    for pod in observation.pods:
        if not pod.is_desired(replicas):
            continue
        snap = observation.snapshots.get(pod.served_identity or "")
        if snap is None:
            return None
        orders.append(snap.info.order)
    return min(orders, default=None)


def plan_deployment(observation: Observation, now: datetime) -> DeploymentPlan:
    deployment = observation.deployment
    spec = deployment.spec
    infos, switches = plan_switches(observation, now)
    pods = observation.pods
    desired = sorted((pod for pod in pods if pod.is_desired(spec.replicas)), key=lambda p: p.name)

    verdicts = validate_chains(infos, break_reports(desired))
    observed_target = recorded_ref(deployment.status, "targetSnapshot")
    target_plan = plan_target(
        infos, verdicts, deployment.name, observed_target, spec.hot_load.kv_cache_policy
    )
    target = target_plan.target
    events = _target_events(target_plan, deployment, infos)

    def order_of(identity: Identity | None) -> tuple[int, int] | None:
        info = infos.get(identity) if identity else None
        return info.order if info is not None else None

    snapshot_patches: dict[str, dict[str, Any]] = {}
    progress_only: set[str] = set()
    propagated: list[tuple[str, float]] = []
    believed = corroborate(desired, {i: info.digest for i, info in infos.items()}, now)
    for identity, observed in observation.snapshots.items():
        if observed.info.deployment != deployment.name:
            continue
        verdict = verdicts[identity]
        snap_plan = plan_snapshot_status(
            observed, verdict, desired, spec.replicas, target, order_of, now,
            switches.get(identity), believed.by_pod,
        )  # fmt: skip
        if snap_plan.patch is not None:
            snapshot_patches[identity] = snap_plan.patch
            if not snap_plan.material:
                progress_only.add(identity)
        if snap_plan.completed_now and observed.created is not None:
            propagated.append((identity, (now - observed.created).total_seconds()))
        events += _snapshot_events(observed, snap_plan.condition_changes, deployment)

    counts = count_fleet(pods, spec.replicas, target.identity if target else None)
    breaks = [
        (info, verdicts[info.identity])
        for info in breaks_ahead_of(infos.values(), verdicts, deployment.name, target)
    ]
    status_plan = plan_deployment_status(
        deployment.status,
        deployment.generation,
        label_selector(deployment.name),
        counts,
        desired,
        target,
        _current(desired, infos, spec),
        breaks,
        now,
    )
    events += _deployment_events(status_plan.condition_changes, deployment)
    events += _replica_failure_events(desired, deployment, observation)

    guards = plan_guards(
        observation.snapshots,
        deployment.name,
        [*(pod.served_identity for pod in pods if pod.served_identity),
         *([target.identity] if target is not None else [])],
        now,
    )  # fmt: skip
    for identity in guards.held:
        events.append(_deletion_held_event(observation, identity, deployment))
    status_patch, material = _with_rollback(
        status_plan.patch, status_plan.material, target_plan, deployment.status, now
    )

    doomed = plan_retention(
        infos,
        deployment.name,
        spec.retention.keep_snapshots,
        target,
        [pod.served_identity for pod in pods if pod.served_identity],
    )
    deletions = [(identity, observation.snapshots[identity].uid) for identity in doomed]
    for identity, _ in deletions:
        snapshot_patches.pop(identity, None)
        events.append(
            EventSpec(
                DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.NORMAL,
                reason_words.SNAPSHOT_RETIRED,
                f"deleted PolicySnapshot {identity}: older than the last "
                f"{spec.retention.keep_snapshots} and no replica needs it",
            )
        )  # fmt: skip
    return DeploymentPlan(
        target=target_plan,
        status_patch=status_patch,
        status_material=material,
        snapshot_patches=snapshot_patches,
        progress_only=frozenset(progress_only),
        deletions=deletions,
        events=events,
        propagated=propagated,
        verdicts=verdicts,
        recheck_at=believed.recheck_at,
        metadata_patches=guards.patches,
        wake_at=(plan.wake_at if target and (plan := switches.get(target.identity)) else None),
    )


def _with_rollback(
    patch: dict[str, Any] | None,
    material: bool,
    plan: TargetPlan,
    recorded: Mapping[str, Any],
    now: datetime,
) -> tuple[dict[str, Any] | None, bool]:
    """The status patch with ``rollback``: set by a backward move of ours (the one record a
    sidecar follows a backward target on), cleared by the next forward move."""
    if plan.move is TargetMove.BACK and plan.target is not None and plan.previous is not None:
        record = {
            "fromIdentity": plan.previous.identity,
            "toIdentity": plan.target.identity,
            "at": precise_time(now),
        }
        return {**(patch or {}), "rollback": record}, True
    if plan.move is TargetMove.FORWARD and recorded.get("rollback") is not None:
        return {**(patch or {}), "rollback": None}, True
    return patch, material


def _deletion_held_event(
    observation: Observation, identity: Identity, deployment: ObservedDeployment
) -> EventSpec:
    serving = sum(1 for pod in observation.pods if pod.served_identity == identity)
    target = recorded_ref(deployment.status, "targetSnapshot")
    why = ", ".join(
        part
        for part in (
            "the target" if target is not None and target.identity == identity else "",
            f"served by {serving} replica(s)" if serving else "",
        )
        if part
    )
    return EventSpec(
        DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.WARNING,
        reason_words.DELETION_HELD,
        f"PolicySnapshot {identity} was deleted while it is {why or 'in use'}: it is kept "
        f"(finalizer {SERVED_FINALIZER}) until it is neither, and the fleet is not rolled "
        "back; it goes once a newer snapshot has rolled out",
    )  # fmt: skip


def _snapshot_events(
    observed: ObservedSnapshot,
    changes: Sequence[tuple[Mapping[str, Any] | None, Mapping[str, Any]]],
    deployment: ObservedDeployment,
) -> list[EventSpec]:
    events: list[EventSpec] = []
    name, uid = observed.info.identity, observed.uid
    for before, after in changes:
        status, reason, message = after["status"], after["reason"], after.get("message", "")
        if after["type"] == CHAIN_VALID and status == "False":
            text = f"chain broken at {name}: {message}"
            events.append(EventSpec(SNAPSHOT_KIND, name, uid, EventType.WARNING, reason, text))
            events.append(
                EventSpec(
                    DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.WARNING, reason,
                    f"{text}; the target waits for the next Full snapshot",
                )
            )  # fmt: skip
        elif (after["type"] == CHAIN_VALID and status == "Unknown" and before is None) or (
            after["type"] == READY and status == "True"
        ):
            events.append(EventSpec(SNAPSHOT_KIND, name, uid, EventType.NORMAL, reason, message))
    return events


def _deployment_events(
    changes: Sequence[tuple[Mapping[str, Any] | None, Mapping[str, Any]]],
    deployment: ObservedDeployment,
) -> list[EventSpec]:
    events: list[EventSpec] = []
    for before, after in changes:
        if after["type"] != DEGRADED:
            continue
        was_degraded = before is not None and before.get("status") == "True"
        if after["status"] == "False" and was_degraded:
            events.append(
                EventSpec(
                    DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.NORMAL,
                    reason_words.RECOVERED, "no longer degraded: " + str(after.get("message", "")),
                )
            )  # fmt: skip
    return events


def _replica_failure_events(
    desired: Sequence[PodReport], deployment: ObservedDeployment, observation: Observation
) -> list[EventSpec]:
    """One Warning per replica that turned Failed for a replica-only reason (its target's
    ledger did not say so yet)."""
    target = recorded_ref(deployment.status, "targetSnapshot")
    observed = observation.snapshots.get(target.identity) if target else None
    ledger = observed.ledger if observed is not None else {}
    events = []
    for pod in desired:
        if (
            pod.state is not ReplicaState.FAILED
            or pod.reason in reason_words.CHAIN_BREAKING_REASONS
            or pod.reason == reason_words.TARGET_INCONSISTENT
        ):
            # Chain breaks have their own Events, on the snapshot and the deployment; a
            # target the replica could not trust is the target's fault, repaired (and said)
            # by the operator.
            continue
        recorded = ledger.get(pod.name)
        if (
            recorded is not None
            and recorded.state is ReplicaState.FAILED
            and (recorded.reason == pod.reason)
        ):
            continue
        events.append(
            EventSpec(
                DEPLOYMENT_KIND, deployment.name, deployment.uid, EventType.WARNING,
                reason_words.REPLICA_FAILED,
                f"replica {pod.name} failed on {pod.failed_identity or pod.target_identity}: "
                f"{pod.reason}: {pod.message or ''}".rstrip(": "),
            )
        )  # fmt: skip
    return events
