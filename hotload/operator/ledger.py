"""Fold the replicas' pod reports into the ledger: pure functions, no API calls.

Each PolicySnapshot's status holds a map keyed by pod name, one entry per desired
replica, saying where that replica stands *relative to this snapshot*:

- ``Ready`` when it serves this snapshot or a newer one (``snapshot`` says which, ``via``
  how it got there, ``since`` when the operator first saw it there);
- ``Failed`` when its sidecar reports a failure (``reason``, ``message``);
- ``Loading`` otherwise (``snapshot`` is what it still serves, if anything).

An entry that has not changed keeps its recorded ``since``, so a reconcile that finds
nothing new writes nothing. The deployment's status gets only counts (it must stay
small: every sidecar watches it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from hotload.api import ReplicaState
from hotload.api.conditions import parse_time, rfc3339
from hotload.operator.pods import PodReport

#: Count key for replicas whose sidecar has not reported a state yet.
NO_STATE: Final = "Pending"

OrderOf = Callable[[str | None], tuple[int, int] | None]
"""Order of a snapshot identity (None when unknown: not in the cluster)."""

WireEntry = dict[str, Any]


@dataclass(frozen=True)
class LedgerEntry:
    """One replica's line in a snapshot's ledger (``ReplicaRecord`` on the wire)."""

    state: ReplicaState
    snapshot: str | None = None
    since: datetime | None = None
    via: str | None = None
    reason: str | None = None
    message: str | None = None

    def to_wire(self) -> WireEntry:
        """The entry as stored (camelCase keys, unset fields absent)."""
        wire: WireEntry = {"state": self.state.value}
        for key, value in (
            ("snapshot", self.snapshot),
            ("since", rfc3339(self.since) if self.since else None),
            ("via", self.via),
            ("reason", self.reason),
            ("message", self.message),
        ):
            if value is not None:
                wire[key] = value
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> LedgerEntry | None:
        try:
            state = ReplicaState(str(wire.get("state")))
        except ValueError:
            return None
        return cls(
            state=state,
            snapshot=wire.get("snapshot"),
            since=parse_time(wire.get("since")),
            via=wire.get("via"),
            reason=wire.get("reason"),
            message=wire.get("message"),
        )

    def same_stance(self, other: LedgerEntry) -> bool:
        """Equal but for ``since``: the replica has not moved relative to the snapshot."""
        return (self.state, self.snapshot, self.via, self.reason, self.message) == (
            other.state, other.snapshot, other.via, other.reason, other.message
        )  # fmt: skip


def serves_at_least(pod: PodReport, order: tuple[int, int], order_of: OrderOf) -> bool:
    """True when the replica serves the snapshot of ``order`` or a newer one."""
    served = order_of(pod.snapshot)
    return served is not None and served >= order


def ledger_entry(
    pod: PodReport,
    order: tuple[int, int],
    order_of: OrderOf,
    recorded: LedgerEntry | None,
    now: datetime,
) -> LedgerEntry:
    """The replica's entry in the ledger of the snapshot of ``order``."""
    if serves_at_least(pod, order, order_of):
        stance = LedgerEntry(ReplicaState.READY, pod.snapshot, None, pod.via)
        if recorded is not None and stance.same_stance(recorded):
            return recorded
        at_target = pod.state is ReplicaState.READY and pod.snapshot == pod.target
        return replace(stance, since=(pod.since if at_target else None) or now)
    if pod.state is ReplicaState.FAILED:
        entry = LedgerEntry(
            ReplicaState.FAILED, pod.snapshot, pod.since or now, pod.via, pod.reason, pod.message
        )
    else:
        entry = LedgerEntry(ReplicaState.LOADING, pod.snapshot, pod.since or pod.created or now)
    if recorded is not None and entry.same_stance(recorded):
        return recorded
    return entry


@dataclass(frozen=True)
class LedgerFold:
    """A snapshot's ledger and counts, from its desired replicas."""

    entries: dict[str, LedgerEntry]
    ready: int
    """Desired replicas serving this snapshot or a newer one."""


def fold_ledger(
    pods: Iterable[PodReport],
    order: tuple[int, int],
    order_of: OrderOf,
    recorded: Mapping[str, LedgerEntry],
    now: datetime,
) -> LedgerFold:
    """The ledger of the snapshot of ``order`` over ``pods`` (the desired replicas)."""
    entries: dict[str, LedgerEntry] = {}
    ready = 0
    for pod in pods:
        entry = ledger_entry(pod, order, order_of, recorded.get(pod.name), now)
        entries[pod.name] = entry
        if entry.state is ReplicaState.READY:
            ready += 1
    return LedgerFold(entries, ready)


def ledger_patch(
    recorded: Mapping[str, LedgerEntry], desired: Mapping[str, LedgerEntry]
) -> dict[str, WireEntry | None]:
    """The merge patch of ``status.replicas``: changed entries whole, removed ones null."""
    patch: dict[str, WireEntry | None] = {}
    for name, entry in desired.items():
        if recorded.get(name) != entry:
            wire: WireEntry = {
                "state": None, "snapshot": None, "since": None, "via": None,
                "reason": None, "message": None,
            }  # fmt: skip
            wire.update(entry.to_wire())
            patch[name] = wire
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
    by_snapshot = Counter(pod.snapshot for pod in desired if pod.snapshot)
    updated = sum(
        1
        for pod in desired
        if target is not None and pod.snapshot == target and pod.state is ReplicaState.READY
    )
    return FleetCounts(
        replicas=len(existing),
        ready=sum(1 for pod in desired if pod.serves_verified),
        updated=updated,
        desired=replicas,
        by_state=dict(sorted(by_state.items())),
        by_snapshot=dict(sorted(by_snapshot.items())),
    )
