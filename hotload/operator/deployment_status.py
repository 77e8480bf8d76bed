"""A RolloutDeployment's status, computed whole from the observed state: a pure function.

Kept small on purpose (every sidecar watches this object): target and current snapshot,
counts, conditions. The conditions:

- ``Available``: every desired replica serves a verified snapshot (its readiness gate).
- ``Progressing``: True while some desired replica is not at the target yet.
- ``SnapshotReady``: every desired replica serves the target.
- ``Degraded``: a snapshot newer than the target is broken (reason: the break's reason;
  the target is held until the next Full), or replicas failed (``ReplicasFailed``).

A write is *material* when the target, the current snapshot, or any condition's status
or reason changes; otherwise (counts, messages) it may be deferred and coalesced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from hotload.api import ConditionStatus, ReplicaState, SnapshotRef, reasons
from hotload.api import conditions as cond
from hotload.api.conditions import AVAILABLE, DEGRADED, PROGRESSING, SNAPSHOT_READY
from hotload.operator.ledger import FleetCounts
from hotload.operator.pods import PodReport
from hotload.operator.rollout import ChainVerdict, SnapshotInfo

#: How many failed replicas a Degraded message names.
FAILED_NAMED: Final = 3
MATERIAL_FIELDS: Final = ("targetSnapshot", "currentSnapshot", "observedGeneration", "selector")


@dataclass(frozen=True)
class DeploymentStatusPlan:
    patch: dict[str, Any] | None
    material: bool
    conditions: list[cond.WireCondition]
    condition_changes: list[tuple[Mapping[str, Any] | None, Mapping[str, Any]]]


def _available(counts: FleetCounts) -> cond.DesiredCondition:
    if counts.desired == 0:
        return cond.DesiredCondition(
            AVAILABLE, ConditionStatus.TRUE, reasons.SCALED_TO_ZERO, "no replicas are wanted"
        )
    message = f"{counts.ready}/{counts.desired} replicas serve a verified snapshot"
    if counts.ready >= counts.desired:
        return cond.DesiredCondition(
            AVAILABLE, ConditionStatus.TRUE, reasons.REPLICAS_SERVING, message
        )
    return cond.DesiredCondition(
        AVAILABLE, ConditionStatus.FALSE, reasons.REPLICAS_UNAVAILABLE, message
    )


def _rollout(counts: FleetCounts, target: SnapshotRef | None) -> list[cond.DesiredCondition]:
    if target is None:
        message = "no valid PolicySnapshot for this deployment yet"
        return [
            cond.DesiredCondition(PROGRESSING, ConditionStatus.FALSE, reasons.NO_TARGET, message),
            cond.DesiredCondition(
                SNAPSHOT_READY, ConditionStatus.FALSE, reasons.NO_TARGET, message
            ),
        ]
    message = f"{counts.updated}/{counts.desired} replicas serve {target.identity}"
    if counts.updated >= counts.desired:
        return [
            cond.DesiredCondition(PROGRESSING, ConditionStatus.FALSE, reasons.ROLLED_OUT, message),
            cond.DesiredCondition(SNAPSHOT_READY, ConditionStatus.TRUE, reasons.ROLLED, message),
        ]
    return [
        cond.DesiredCondition(PROGRESSING, ConditionStatus.TRUE, reasons.ROLLING, message),
        cond.DesiredCondition(SNAPSHOT_READY, ConditionStatus.FALSE, reasons.ROLLING, message),
    ]


def _degraded(
    breaks: Sequence[tuple[SnapshotInfo, ChainVerdict]],
    failed: Sequence[PodReport],
    target: SnapshotRef | None,
) -> cond.DesiredCondition:
    if breaks:
        info, verdict = breaks[0]
        held = f"target held at {target.identity}" if target is not None else "no target"
        return cond.DesiredCondition(
            DEGRADED,
            ConditionStatus.TRUE,
            verdict.reason,
            f"snapshot {info.identity} (step {info.step}) is broken: {verdict.message}; "
            f"{held} until the next Full snapshot",
        )
    if failed:
        named = "; ".join(
            f"{pod.name}: {pod.reason or 'Failed'}: {pod.message or ''}".rstrip(": ")
            for pod in failed[:FAILED_NAMED]
        )
        more = f" (and {len(failed) - FAILED_NAMED} more)" if len(failed) > FAILED_NAMED else ""
        return cond.DesiredCondition(
            DEGRADED,
            ConditionStatus.TRUE,
            reasons.REPLICAS_FAILED,
            f"{len(failed)} replica(s) failed: {named}{more}",
        )
    return cond.DesiredCondition(
        DEGRADED, ConditionStatus.FALSE, reasons.HEALTHY, "no broken snapshot, no failed replica"
    )


def plan_deployment_status(
    recorded: Mapping[str, Any],
    generation: int | None,
    selector: str,
    counts: FleetCounts,
    desired_pods: Sequence[PodReport],
    target: SnapshotRef | None,
    current: SnapshotRef | None,
    breaks: Sequence[tuple[SnapshotInfo, ChainVerdict]],
    now: datetime,
) -> DeploymentStatusPlan:
    recorded_conditions: list[Mapping[str, Any]] = list(recorded.get("conditions") or [])
    failed = sorted(
        (
            pod
            for pod in desired_pods
            if pod.state is ReplicaState.FAILED and pod.reason != reasons.TARGET_INCONSISTENT
        ),
        key=lambda p: p.name,
    )  # a target a replica could not trust is the operator's to repair, not a failed replica
    desired_conditions = [
        _available(counts),
        *_rollout(counts, target),
        _degraded(breaks, failed, target),
    ]
    merged = cond.merge_conditions(
        recorded_conditions, desired_conditions, observed_generation=generation, now=now
    )
    fields: dict[str, Any] = {
        "observedGeneration": generation,
        "targetSnapshot": target.to_k8s() if target is not None else None,
        "currentSnapshot": current.to_k8s() if current is not None else None,
        "replicas": counts.replicas,
        "readyReplicas": counts.ready,
        "updatedReplicas": counts.updated,
        "selector": selector,
        "conditions": merged,
    }
    patch = {key: value for key, value in fields.items() if recorded.get(key) != value}
    for key in ("targetSnapshot", "currentSnapshot"):
        before, wanted = recorded.get(key), patch.get(key)
        if isinstance(before, Mapping) and isinstance(wanted, dict):
            # A merge patch merges objects: a field the reference lost (the target's
            # switchBy once the switch is committed) is named with null.
            patch[key] = {**{name: None for name in before if name not in wanted}, **wanted}
    for key, counted in (
        ("replicasByState", counts.by_state),
        ("replicasBySnapshot", counts.by_snapshot),
    ):
        stored: Mapping[str, Any] = recorded.get(key) or {}
        if stored != counted:
            # A merge patch merges maps: name what went away with null.
            patch[key] = {**{name: None for name in stored if name not in counted}, **counted}
    changes = cond.transitions(recorded_conditions, merged)
    material = bool(changes) or any(key in patch for key in MATERIAL_FIELDS)
    return DeploymentStatusPlan(
        patch=patch or None, material=material, conditions=merged, condition_changes=changes
    )
