"""A PolicySnapshot's status, computed whole from the observed state: a pure function.

- ``ChainValid`` is the chain planner's verdict (``rollout.validate_chains``).
- ``Ready`` turns True once every desired replica serves this snapshot or a newer one, on
  reports the operator corroborates (``corroboration.py``)
  (reason ``Rolled`` while it is the target, ``Superseded`` when a newer one is), and
  then stays True: it is a latch, so ``kubectl wait`` never misses it. A broken snapshot
  never turns Ready.
- The ledger and counts are live while the snapshot is the target, or until it is
  Ready; after that they are the record of how it rolled out and are no longer written
  (so a rollout writes O(1) objects however many snapshots exist). A snapshot newer
  than the target has no ledger yet: no replica is working on it.
- A finished record (Ready latched and no longer the target, or its chain recorded broken)
  is sealed: ``sealedAt`` is written once, and from then on its ledger, counts, Ready
  condition and propagation are never written again (the chart's fencing policy refuses
  such a write too). Only ``ChainValid`` may still turn False: a later replay that finds
  its files bad in the bucket is recorded.
- ``propagation`` records when it became the target, when the first replica and when
  all replicas reached it (its creation time is ``metadata.creationTimestamp``).
- In a coordinated switch (``operator/switch.py``), ``stagedReplicas`` counts the desired
  replicas Staged for it or serving it (or newer) — what the publisher waits on before it
  commits — and ``switch`` records the decision, the switch time, the deadline and how many
  replicas switched late.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from hotload.api import ConditionStatus, ReplicaRecord, SnapshotPhase, SnapshotRef, reasons
from hotload.api import conditions as cond
from hotload.api.conditions import CHAIN_VALID, READY
from hotload.api.kinds import Identity
from hotload.api.policy_snapshot import Corroboration, SwitchRecord
from hotload.api.switch import switch_time
from hotload.operator.ledger import (
    OrderOf,
    WireEntry,
    fold_ledger,
    is_staged,
    ledger_patch,
    serves_at_least,
)
from hotload.operator.pods import PodReport
from hotload.operator.rollout import ChainVerdict, SnapshotInfo, snapshot_order
from hotload.operator.switch import SwitchPlan

TARGET_SET_AT: Final = "targetSetAt"
FIRST_READY_AT: Final = "firstReplicaReadyAt"
ALL_READY_AT: Final = "allReplicasReadyAt"
SEALED_AT: Final = "sealedAt"
SWITCH: Final = "switch"
#: Every field of ``status.switch``, null: a changed record is written whole (merge patch).
_SWITCH_CLEARED: Final = dict.fromkeys(("decision", "at", "by", "lateReplicas"))


def precise_time(moment: datetime) -> str:
    """RFC 3339 with milliseconds: propagation is a measurement, seconds are too coarse."""
    return switch_time(moment)


@dataclass(frozen=True)
class ObservedSnapshot:
    """One PolicySnapshot as last seen: its facts, and its status as recorded."""

    info: SnapshotInfo
    uid: str
    created: datetime | None
    generation: int | None
    status: Mapping[str, Any]
    ledger: Mapping[str, ReplicaRecord]
    """``status.replicas`` parsed (once, when the object was observed)."""
    finalizers: tuple[str, ...] = ()
    deletion_announced: bool = False
    """Its held deletion was announced already (``hotload.dev/deletion-held``)."""


@dataclass(frozen=True)
class SnapshotStatusPlan:
    patch: dict[str, Any] | None
    """Merge patch of ``status`` (None: nothing to write)."""
    conditions: list[cond.WireCondition]
    condition_changes: list[tuple[Mapping[str, Any] | None, Mapping[str, Any]]]
    ready_replicas: int
    completed_now: bool
    """Ready latched in this reconcile (the propagation histogram observes it)."""


def _ready_message(ready: int, desired: int, identity: Identity, exact: bool) -> str:
    newer = "" if exact else " or a newer snapshot"
    return f"{ready}/{desired} replicas serve {identity}{newer}"


def plan_snapshot_status(
    observed: ObservedSnapshot,
    verdict: ChainVerdict,
    desired_pods: Sequence[PodReport],
    desired_replicas: int,
    target: SnapshotRef | None,
    order_of: OrderOf,
    now: datetime,
    switch: SwitchPlan | None = None,
    corroborations: Mapping[str, Corroboration] | None = None,
) -> SnapshotStatusPlan:
    """``switch``: its coordinated switch (None: the deployment switches Independent)."""
    info = observed.info
    recorded = observed.status
    recorded_conditions: list[Mapping[str, Any]] = list(recorded.get("conditions") or [])
    latched = cond.is_true(recorded_conditions, READY)
    is_target = target is not None and target.identity == info.identity
    target_order = snapshot_order(target.step, target.kind) if target is not None else None
    reached_by_target = target_order is not None and target_order >= info.order
    propagation: dict[str, Any] = dict(recorded.get("propagation") or {})
    recorded_broken = (find := cond.find_wire(recorded_conditions, CHAIN_VALID)) is not None and (
        find.get("status") == ConditionStatus.FALSE.value
    )
    # A sealed record stays as it is even when a rollback makes it the target again.
    frozen = (latched and not is_target) or recorded_broken or bool(recorded.get(SEALED_AT))

    chain = cond.DesiredCondition(CHAIN_VALID, verdict.status, verdict.reason, verdict.message)
    ledger_changes: dict[str, WireEntry | None] = {}
    staged = late = 0
    if frozen:
        ready = int(recorded.get("readyReplicas") or 0)
        desired = int(recorded.get("desiredReplicas") or 0)
        ready_condition = cond.find_wire(recorded_conditions, READY)
        desired_conditions = [chain]
        if ready_condition is not None:
            desired_conditions.append(
                cond.DesiredCondition(
                    READY,
                    ConditionStatus(ready_condition.get("status", "Unknown")),
                    str(ready_condition.get("reason") or reasons.ROLLED),
                    str(ready_condition.get("message") or ""),
                )
            )
        else:
            desired_conditions.append(
                cond.DesiredCondition(
                    READY, ConditionStatus.FALSE, reasons.CHAIN_INVALID, verdict.message
                )
            )
        now_ready = latched
    else:
        desired = desired_replicas
        # Live: the target, what the target passed, what was ever targeted, and a snapshot
        # breaking now (its ledger records the replicas' failures before it freezes).
        live = is_target or reached_by_target or TARGET_SET_AT in propagation or verdict.broken
        if live:
            coordinated = info.identity if switch is not None else None
            fold = fold_ledger(
                desired_pods,
                info.order,
                order_of,
                observed.ledger,
                now,
                coordinated,
                corroborations=corroborations or {},
            )
            ledger_changes = ledger_patch(observed.ledger, fold.entries)
            ready, staged, late = fold.ready, fold.staged, fold.late
        else:
            ledger_changes = {name: None for name in observed.ledger}
            ready = sum(1 for pod in desired_pods if serves_at_least(pod, info.order, order_of))
            staged = ready + sum(1 for pod in desired_pods if is_staged(pod, info.identity))
        now_ready = latched or (not verdict.broken and reached_by_target and ready >= desired)
        if now_ready:
            if latched:
                previous = cond.find_wire(recorded_conditions, READY) or {}
                reason = str(previous.get("reason") or reasons.ROLLED)
            else:
                reason = reasons.ROLLED if is_target else reasons.SUPERSEDED
            ready_cond = cond.DesiredCondition(
                READY,
                ConditionStatus.TRUE,
                reason,
                _ready_message(ready, desired, info.identity, reason == reasons.ROLLED),
            )
        elif verdict.broken:
            ready_cond = cond.DesiredCondition(
                READY, ConditionStatus.FALSE, reasons.CHAIN_INVALID, verdict.message
            )
        elif is_target:
            ready_cond = cond.DesiredCondition(
                READY,
                ConditionStatus.FALSE,
                reasons.ROLLING,
                _ready_message(ready, desired, info.identity, exact=False),
            )
        else:
            ready_cond = cond.DesiredCondition(
                READY,
                ConditionStatus.FALSE,
                reasons.PENDING,
                "not the target yet"
                if verdict.valid
                else f"waiting for its chain: {verdict.message}",
            )
        desired_conditions = [chain, ready_cond]
        stamp = precise_time(now)
        if is_target:
            propagation.setdefault(TARGET_SET_AT, stamp)
        if ready > 0 and live:
            propagation.setdefault(FIRST_READY_AT, stamp)
        if now_ready:
            propagation.setdefault(ALL_READY_AT, stamp)

    merged = cond.merge_conditions(
        recorded_conditions, desired_conditions, observed_generation=observed.generation, now=now
    )
    if verdict.broken:
        phase = SnapshotPhase.FAILED
    elif now_ready:
        phase = SnapshotPhase.READY
    elif is_target:
        phase = SnapshotPhase.ROLLING
    else:
        phase = SnapshotPhase.PENDING
    fields: dict[str, Any] = {
        "observedGeneration": observed.generation,
        "phase": phase.value,
        "desiredReplicas": desired,
        "readyReplicas": ready,
        "replicasSummary": f"{ready}/{desired}",
        "conditions": merged,
    }
    if propagation:
        fields["propagation"] = propagation
    if switch is not None and not frozen:
        fields["stagedReplicas"] = staged
        record = SwitchRecord(
            decision=switch.decision, at=switch.at, by=switch.deadline, late_replicas=late
        ).to_k8s()
        if recorded.get(SWITCH) != record:
            fields[SWITCH] = {**_SWITCH_CLEARED, **record}
    if frozen and not recorded.get(SEALED_AT):
        fields[SEALED_AT] = precise_time(now)
    patch = {key: value for key, value in fields.items() if recorded.get(key) != value}
    if ledger_changes:
        patch["replicas"] = ledger_changes
    return SnapshotStatusPlan(
        patch=patch or None,
        conditions=merged,
        condition_changes=cond.transitions(recorded_conditions, merged),
        ready_replicas=ready,
        completed_now=now_ready and not latched,
    )
