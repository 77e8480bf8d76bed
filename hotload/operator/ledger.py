"""Fold the replicas' pod reports into the ledger: pure functions, no API calls.

Each PolicySnapshot's status holds a map keyed by pod name, one entry per desired
replica, saying where that replica stands *relative to this snapshot*:

- ``Ready`` when it serves this snapshot or a newer one on a report the operator can
  corroborate (``snapshot`` says which, ``via`` how it got there, ``since`` when the
  operator first saw it there, ``digest`` and ``corroboration`` why it is believed);
- ``Loading`` with ``corroboration`` Pending or Disputed when it says it serves it on a
  report not corroborated (yet): the entry's message says why it does not count;
- ``Failed`` when its sidecar reports a failure (``reason``, ``message``);
- ``Loading`` otherwise (``snapshot`` is what it still serves, if anything).

In a coordinated switch an entry also carries the replica's ``phase``: ``Staged`` (Loading,
this snapshot staged, waiting for the switch time), ``OnTime`` or ``Late`` (Ready on it).

An entry is the API's :class:`~hotload.api.ReplicaRecord`, read and written by that model
(one wire format). An entry that has not changed keeps its recorded ``since``, so a
reconcile that finds nothing new writes nothing. The deployment's status gets only counts
(it must stay small: every sidecar watches it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from hotload.api import ReplicaRecord, ReplicaState, reasons
from hotload.api.kinds import Identity
from hotload.api.policy_snapshot import Corroboration
from hotload.api.switch import SwitchPhase
from hotload.operator.corroboration import REPORT_STANDS_S, counts
from hotload.operator.pods import PodReport

#: Count key for replicas whose sidecar has not reported a state yet.
NO_STATE: Final = "Pending"

OrderOf = Callable[[str | None], tuple[int, int] | None]
"""Order of a snapshot identity (None when unknown: not in the cluster)."""

WireEntry = dict[str, Any]


#: Every field of an entry, null: a changed entry is written whole (merge patch). The
#: coordinated switch's ``phase`` is nulled only where it was recorded (no bytes otherwise).
_CLEARED: Final[WireEntry] = dict.fromkeys(
    ReplicaRecord(state=ReplicaState.LOADING).model_dump(by_alias=True, exclude={"phase"})
)

_CLEARED_PHASE: Final[WireEntry] = {**_CLEARED, "phase": None}


def parse_ledger(raw: object) -> dict[str, ReplicaRecord]:
    """``status.replicas`` as recorded; an entry its model refuses is left out (rewritten)."""
    ledger: dict[str, ReplicaRecord] = {}
    if not isinstance(raw, Mapping):
        return ledger
    for name, wire in raw.items():
        try:
            ledger[str(name)] = ReplicaRecord.model_validate(wire)
        except ValidationError:
            continue
    return ledger


def same_stance(entry: ReplicaRecord, other: ReplicaRecord) -> bool:
    """Equal but for ``since``: the replica has not moved relative to the snapshot."""
    return entry.model_dump(exclude={"since"}) == other.model_dump(exclude={"since"})


def serves_at_least(pod: PodReport, order: tuple[int, int], order_of: OrderOf) -> bool:
    """True when the replica serves the snapshot of ``order`` or a newer one."""
    served = order_of(pod.served_identity)
    return served is not None and served >= order


def is_staged(pod: PodReport, identity: Identity | None) -> bool:
    """The replica reports ``identity`` staged for a coordinated switch."""
    return (
        identity is not None
        and pod.switch_phase is SwitchPhase.STAGED
        and pod.target_identity == identity
        and pod.state is ReplicaState.LOADING
    )


def switched_phase(pod: PodReport, identity: Identity | None) -> SwitchPhase | None:
    """How the replica switched to ``identity`` (OnTime, Late), if it serves it so."""
    if identity is None or pod.served_identity != identity:
        return None
    if pod.switch_phase in (SwitchPhase.ON_TIME, SwitchPhase.LATE):
        return pod.switch_phase
    return None


def _unbelieved(
    pod: PodReport, corroboration: Corroboration | None, now: datetime
) -> ReplicaRecord:
    """A replica that says it serves the snapshot (or newer) on a report not corroborated
    yet: Loading, and the entry says why it does not count."""
    if corroboration is Corroboration.DISPUTED:
        why = (
            f"reports {pod.served_identity} with digest {pod.digest}, which is not the "
            "snapshot's (or the other replicas'): not counted while it differs"
        )
        reason: str | None = reasons.DIGEST_MISMATCH
    else:
        how = "with a digest nothing confirms yet" if pod.digest else "without a digest"
        why = (
            f"reports {pod.served_identity} {how}: counted once the report has stood "
            f"{REPORT_STANDS_S:.0f} s unchallenged"
        )
        reason = None
    return ReplicaRecord(
        state=ReplicaState.LOADING,
        snapshot=pod.served_identity,
        since=pod.first_seen or now,
        reason=reason,
        message=why,
        digest=pod.digest,
        corroboration=corroboration or Corroboration.PENDING,
    )


def ledger_entry(
    pod: PodReport,
    order: tuple[int, int],
    order_of: OrderOf,
    recorded: ReplicaRecord | None,
    now: datetime,
    identity: Identity | None = None,
    corroboration: Corroboration | None = None,
) -> ReplicaRecord:
    """The replica's entry in the ledger of the snapshot of ``order`` (``identity``: the
    snapshot's, for a coordinated switch's phase); a replica that serves it (or newer) is
    Ready only on a corroborated report (``corroboration.py``)."""
    if serves_at_least(pod, order, order_of):
        if not counts(corroboration):
            entry = _unbelieved(pod, corroboration, now)
            if recorded is not None and same_stance(entry, recorded):
                return recorded
            return entry
        stance = ReplicaRecord(
            state=ReplicaState.READY,
            snapshot=pod.served_identity,
            via=pod.load_path,
            phase=switched_phase(pod, identity),
            digest=pod.digest,
            corroboration=corroboration,
        )
        if recorded is not None and same_stance(stance, recorded):
            return recorded
        at_target = pod.state is ReplicaState.READY and pod.served_identity == pod.target_identity
        return stance.model_copy(update={"since": (pod.since if at_target else None) or now})
    if pod.state is ReplicaState.FAILED:
        entry = ReplicaRecord(
            state=ReplicaState.FAILED,
            snapshot=pod.served_identity,
            since=pod.since or now,
            via=pod.load_path,
            reason=pod.reason,
            message=pod.message,
        )
    else:
        entry = ReplicaRecord(
            state=ReplicaState.LOADING,
            snapshot=pod.served_identity,
            since=pod.since or pod.created or now,
            phase=SwitchPhase.STAGED if is_staged(pod, identity) else None,
        )
    if recorded is not None and same_stance(entry, recorded):
        return recorded
    return entry


@dataclass(frozen=True)
class LedgerFold:
    """A snapshot's ledger and counts, from its desired replicas."""

    entries: dict[str, ReplicaRecord]
    ready: int
    """Desired replicas serving this snapshot or a newer one."""
    staged: int = 0
    """Desired replicas Staged for it, or serving it or a newer one (coordinated switch)."""
    late: int = 0
    """Desired replicas that switched to it late (coordinated switch)."""


def fold_ledger(
    pods: Iterable[PodReport],
    order: tuple[int, int],
    order_of: OrderOf,
    recorded: Mapping[str, ReplicaRecord],
    now: datetime,
    identity: Identity | None = None,
    *,
    corroborations: Mapping[str, Corroboration],
) -> LedgerFold:
    """The ledger of the snapshot of ``order`` over ``pods`` (the desired replicas)."""
    entries: dict[str, ReplicaRecord] = {}
    ready = staged = late = 0
    for pod in pods:
        entry = ledger_entry(
            pod, order, order_of, recorded.get(pod.name), now, identity,
            corroborations.get(pod.name),
        )  # fmt: skip
        entries[pod.name] = entry
        if entry.state is ReplicaState.READY:
            ready += 1
        if entry.state is ReplicaState.READY or entry.phase is SwitchPhase.STAGED:
            staged += 1
        if entry.phase is SwitchPhase.LATE:
            late += 1
    return LedgerFold(entries, ready, staged, late)


def ledger_patch(
    recorded: Mapping[str, ReplicaRecord], desired: Mapping[str, ReplicaRecord]
) -> dict[str, WireEntry | None]:
    """The merge patch of ``status.replicas``: changed entries whole, removed ones null."""
    patch: dict[str, WireEntry | None] = {}
    for name, entry in desired.items():
        before = recorded.get(name)
        if before != entry:
            cleared = _CLEARED if before is None or before.phase is None else _CLEARED_PHASE
            patch[name] = {**cleared, **entry.to_k8s()}
    for name in recorded:
        if name not in desired:
            patch[name] = None
    return patch


@dataclass(frozen=True)
class FleetCounts:
    """The deployment's small status counts."""

    replicas: int
    """Replica pods that exist and are not terminating."""
    ready: int
    """Desired replicas that serve a verified snapshot (their readiness gate)."""
    updated: int
    """Desired replicas at the target (serving it, state Ready)."""
    desired: int
    by_state: dict[str, int]
    by_snapshot: dict[str, int]


def count_fleet(pods: Iterable[PodReport], replicas: int, target: str | None) -> FleetCounts:
    existing = [pod for pod in pods if not pod.terminating]
    desired = [pod for pod in existing if pod.is_desired(replicas)]
    by_state = Counter(pod.state.value if pod.state else NO_STATE for pod in desired)
    by_snapshot = Counter(pod.served_identity for pod in desired if pod.served_identity)
    updated = sum(
        1
        for pod in desired
        if target is not None and pod.served_identity == target and pod.state is ReplicaState.READY
    )
    return FleetCounts(
        replicas=len(existing),
        ready=sum(1 for pod in desired if pod.serves_verified),
        updated=updated,
        desired=replicas,
        by_state=dict(sorted(by_state.items())),
        by_snapshot=dict(sorted(by_snapshot.items())),
    )
