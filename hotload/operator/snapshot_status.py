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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from hotload.api import (
    ConditionStatus,
    ReplicaRecord,
    ReplicaState,
    SnapshotPhase,
    SnapshotRef,
    reasons,
)
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
    material: bool = True
    """False when the patch only records progress (:data:`PROGRESS_FIELDS`, no condition's
    status or reason changed): such a write may wait for the reconciler's status interval."""


#: What a rollout's progress alone changes in a snapshot's status: its ledger, its counts and
#: its conditions' messages. The object carries the whole ledger (~300 bytes per replica), and
#: the API server decodes, validates and stores all of it on every write: at 1,000 replicas
#: the ledger's writes every half second were ~19 % of the API server's CPU in a rollout
#: (bench/propagation/one-region-1000). A patch of only these fields waits up to the
#: reconciler's status interval (as the deployment's counts do); anything else — a replica
#: that failed, a condition that changes status or reason (Ready latching, a break), the
#: propagation times, the switch, the staged count, the seal — is written at once.
PROGRESS_FIELDS: Final = frozenset({"replicas", "readyReplicas", "replicasSummary", "conditions"})


def _ready_message(ready: int, desired: int, identity: Identity, exact: bool) -> str:
    newer = "" if exact else " or a newer snapshot"
    return f"{ready}/{desired} replicas serve {identity}{newer}"


@dataclass(frozen=True)
class _Facts:
    """What the rules read: the snapshot, its verdict, its record, and the counts."""

    info: SnapshotInfo
    verdict: ChainVerdict
    recorded_conditions: list[Mapping[str, Any]]
    latched: bool
    """``Ready`` is recorded True: it stays so."""
    is_target: bool
    reached_by_target: bool
    """The target is this snapshot or a newer one."""
    ready: int
    desired: int


ReadyRule = Callable[[_Facts], "cond.DesiredCondition | None"]
"""One rule of the ``Ready`` chain: the condition when it applies, else None."""


def _ready(
    facts: _Facts, status: ConditionStatus, reason: str, message: str
) -> cond.DesiredCondition:
    return cond.DesiredCondition(READY, status, reason, message)


def ready_latched(facts: _Facts) -> cond.DesiredCondition | None:
    """A Ready snapshot stays Ready (its reason as recorded), counts kept current."""
    if not facts.latched:
        return None
    previous = cond.find_wire(facts.recorded_conditions, READY) or {}
    reason = str(previous.get("reason") or reasons.ROLLED)
    exact = reason == reasons.ROLLED
    message = _ready_message(facts.ready, facts.desired, facts.info.identity, exact)
    return _ready(facts, ConditionStatus.TRUE, reason, message)


def ready_reached(facts: _Facts) -> cond.DesiredCondition | None:
    """Every desired replica serves it or a newer snapshot, and its chain is not broken:
    ``Rolled`` while it is the target, ``Superseded`` once a newer one is."""
    if facts.verdict.broken or not facts.reached_by_target or facts.ready < facts.desired:
        return None
    reason = reasons.ROLLED if facts.is_target else reasons.SUPERSEDED
    message = _ready_message(facts.ready, facts.desired, facts.info.identity, facts.is_target)
    return _ready(facts, ConditionStatus.TRUE, reason, message)


def chain_invalid(facts: _Facts) -> cond.DesiredCondition | None:
    """A broken snapshot never turns Ready."""
    if not facts.verdict.broken:
        return None
    return _ready(facts, ConditionStatus.FALSE, reasons.CHAIN_INVALID, facts.verdict.message)


def rolling(facts: _Facts) -> cond.DesiredCondition | None:
    """The target, on its way."""
    if not facts.is_target:
        return None
    message = _ready_message(facts.ready, facts.desired, facts.info.identity, exact=False)
    return _ready(facts, ConditionStatus.FALSE, reasons.ROLLING, message)


def pending(facts: _Facts) -> cond.DesiredCondition:
    """Not the target (yet), or its chain is not known to be complete."""
    verdict = facts.verdict
    message = "not the target yet" if verdict.valid else f"waiting for its chain: {verdict.message}"
    return _ready(facts, ConditionStatus.FALSE, reasons.PENDING, message)


#: The ``Ready`` rules of a live snapshot, in order: the first that applies decides.
READY_RULES: Final[tuple[ReadyRule, ...]] = (
    ready_latched,
    ready_reached,
    chain_invalid,
    rolling,
    pending,
)


def as_recorded(facts: _Facts) -> cond.DesiredCondition:
    """A frozen snapshot's ``Ready`` stays what was recorded (ChainInvalid if never set)."""
    recorded = cond.find_wire(facts.recorded_conditions, READY)
    if recorded is None:
        return _ready(facts, ConditionStatus.FALSE, reasons.CHAIN_INVALID, facts.verdict.message)
    return _ready(
        facts,
        ConditionStatus(recorded.get("status", "Unknown")),
        str(recorded.get("reason") or reasons.ROLLED),
        str(recorded.get("message") or ""),
    )


def phase_of(facts: _Facts, now_ready: bool) -> SnapshotPhase:
    """Failed (broken), Ready, Rolling (the target), else Pending — in that order."""
    if facts.verdict.broken:
        return SnapshotPhase.FAILED
    if now_ready:
        return SnapshotPhase.READY
    if facts.is_target:
        return SnapshotPhase.ROLLING
    return SnapshotPhase.PENDING


def _live_ledger(
    observed: ObservedSnapshot,
    desired_pods: Sequence[PodReport],
    order_of: OrderOf,
    now: datetime,
    live: bool,
    coordinated: Identity | None,
    corroborations: Mapping[str, Corroboration],
) -> tuple[dict[str, WireEntry | None], int, int, int]:
    """The ledger's patch and the ready, staged and late counts: folded while live (on
    corroborated reports), else dropped and counted. ``coordinated``: the identity a
    coordinated switch stages."""
    info = observed.info
    if live:
        fold = fold_ledger(
            desired_pods,
            info.order,
            order_of,
            observed.ledger,
            now,
            coordinated,
            corroborations=corroborations,
        )
        return ledger_patch(observed.ledger, fold.entries), fold.ready, fold.staged, fold.late
    ready = sum(1 for pod in desired_pods if serves_at_least(pod, info.order, order_of))
    staged = ready + sum(1 for pod in desired_pods if is_staged(pod, info.identity))
    return {name: None for name in observed.ledger}, ready, staged, 0


def _stamp(
    propagation: dict[str, Any], facts: _Facts, *, live: bool, now_ready: bool, now: datetime
) -> None:
    """Each propagation time, written once: target set, first replica, all replicas."""
    stamp = precise_time(now)
    if facts.is_target:
        propagation.setdefault(TARGET_SET_AT, stamp)
    if facts.ready > 0 and live:
        propagation.setdefault(FIRST_READY_AT, stamp)
    if now_ready:
        propagation.setdefault(ALL_READY_AT, stamp)


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
    recorded_broken = (chain := cond.find_wire(recorded_conditions, CHAIN_VALID)) is not None and (
        chain.get("status") == ConditionStatus.FALSE.value
    )
    # Frozen: Ready and past the target, or recorded broken: the record of how it went.
    # A sealed record stays as it is even when a rollback makes it the target again.
    frozen = (latched and not is_target) or recorded_broken or bool(recorded.get(SEALED_AT))
    ledger_changes: dict[str, WireEntry | None] = {}
    staged = late = 0
    if frozen:
        ready = int(recorded.get("readyReplicas") or 0)
        desired = int(recorded.get("desiredReplicas") or 0)
    else:
        desired = desired_replicas
        # Live: the target, what the target passed, what was ever targeted, and a snapshot
        # breaking now (its ledger records the replicas' failures before it freezes).
        live = is_target or reached_by_target or TARGET_SET_AT in propagation or verdict.broken
        coordinated = info.identity if switch is not None else None
        ledger_changes, ready, staged, late = _live_ledger(
            observed, desired_pods, order_of, now, live, coordinated, corroborations or {}
        )
    facts = _Facts(
        info, verdict, recorded_conditions, latched, is_target, reached_by_target, ready, desired
    )
    if frozen:
        ready_cond = as_recorded(facts)
    else:
        ready_cond = next(c for rule in READY_RULES if (c := rule(facts)) is not None)
    now_ready = ready_cond.status is ConditionStatus.TRUE
    if not frozen:
        _stamp(propagation, facts, live=live, now_ready=now_ready, now=now)
    chain_cond = cond.DesiredCondition(CHAIN_VALID, verdict.status, verdict.reason, verdict.message)
    merged = cond.merge_conditions(
        recorded_conditions,
        [chain_cond, ready_cond],
        observed_generation=observed.generation,
        now=now,
    )
    fields: dict[str, Any] = {
        "observedGeneration": observed.generation,
        "phase": phase_of(facts, now_ready).value,
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
    changes = cond.transitions(recorded_conditions, merged)
    return SnapshotStatusPlan(
        patch=patch or None,
        conditions=merged,
        condition_changes=changes,
        ready_replicas=ready,
        completed_now=now_ready and not latched,
        material=bool(changes) or not set(patch) <= PROGRESS_FIELDS or _fails(ledger_changes),
    )


def _fails(ledger_changes: Mapping[str, Any]) -> bool:
    """Whether a ledger patch records a replica failing (never left waiting)."""
    return any(
        entry is not None and entry.get("state") == ReplicaState.FAILED.value
        for entry in ledger_changes.values()
    )
