"""Plan chain validity and the deployment's target: pure functions, no API calls.

The rules (CONTRACTS.md "Ordering, Ready, fallback" and "Decisions"; written out for
users in docs/contracts.md):

- Snapshots of one deployment are ordered by step; at equal steps a Full (or LoRA)
  outranks an Incremental.
- A Full or LoRA snapshot starts a chain. An Incremental one is valid when its previous
  exists, belongs to the same deployment, comes strictly before it, and is itself
  valid; its previous not being in the cluster (yet) is ``Unknown``/``PreviousMissing``,
  never a break. A declared format we do not support is ``ManifestInvalid``.
- A replica's chain-breaking report marks the snapshot it names (its
  ``hotload.dev/failed-snapshot``, else its target) ``False`` with the reported reason;
  every delta built on a broken snapshot is broken too. ``False`` never turns back:
  a bad bucket is answered by a new Full, not by repairing the old one.
- A verdict once ``True`` survives its previous being deleted (retention removes old
  objects; the chain was checked while they were there).
- The target moves forward only, onto the newest snapshot whose chain is valid and whose
  deletion nobody asked for, so it never lands on or past a break (after a break only a
  new Full is valid again). A target whose deletion was asked for stays the target (it
  is held by a finalizer) until a newer one is valid. The
  one backward move: when the target itself turns out broken (or is not a valid
  snapshot of ours at all: another writer, a deleted object), it returns to the newest
  valid snapshot, so new pods load what the others still serve.
- A snapshot whose coordinated switch was aborted (``operator/switch.py``) is never a new
  target, and a target whose switch is aborted goes back the same way: to the newest
  valid snapshot, which is what the fleet still serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

from hotload.api import ConditionStatus, KvCachePolicy, SnapshotKind, SnapshotRef, reasons
from hotload.api.formats import READABLE_FORMATS, FileHash
from hotload.api.kinds import Identity
from hotload.operator.switch import SwitchFacts

#: Formats the sidecar decodes (the manifest is the truth; this is the trainer's declaration).
SUPPORTED_COMPRESSION_FORMATS: Final = frozenset(READABLE_FORMATS)
SUPPORTED_CHECKSUM_FORMATS: Final = frozenset(h.value for h in FileHash)


@dataclass(frozen=True)
class Checkpoint:
    """A delta's ``spec.incremental.checkpoint``: the Full ``identity`` (in the bucket only,
    no PolicySnapshot) holds the weights of ``of``, a snapshot of the delta's chain. Who
    holds nothing of the chain after ``of`` loads it and the deltas after ``of``, so
    retention keeps nothing of the chain older than ``of``."""

    identity: Identity
    of: Identity


@dataclass(frozen=True)
class SnapshotInfo:
    """What the planners need of one PolicySnapshot (spec, plus its recorded verdict)."""

    identity: Identity
    deployment: str
    step: int
    kind: SnapshotKind
    previous: str | None = None
    compression_format: str | None = None
    checksum_format: str | None = None
    kv_cache_policy: KvCachePolicy | None = None
    recorded: ChainVerdict | None = None
    """The ``ChainValid`` condition its status carries now (None when it has none)."""
    digest: str | None = None
    """The rebuilt weights' digest its spec declares (``spec.digest``), when it does."""
    checkpoint: Checkpoint | None = None
    """The checkpoint its spec names (``spec.incremental.checkpoint``), deltas only."""
    deleting: bool = False
    """Its deletion was asked for (it is held while the target or served): never a new
    target."""
    switch: SwitchFacts = field(default_factory=SwitchFacts)
    """What the publisher wrote about its coordinated switch (its annotations)."""
    aborted: bool = False
    """Its coordinated switch was aborted (planned from ``switch``): never a target."""
    switch_at: datetime | None = None
    """The target's ``switchAt`` when it is the target (planned from ``switch``)."""
    switch_by: datetime | None = None
    """The target's ``switchBy`` when it is the target (planned from ``switch``)."""

    @property
    def order(self) -> tuple[int, int]:
        return snapshot_order(self.step, self.kind)

    def ref(self, default_policy: KvCachePolicy, *, with_switch: bool = True) -> SnapshotRef:
        return SnapshotRef(
            identity=self.identity,
            step=self.step,
            kind=self.kind,
            kv_cache_policy=self.kv_cache_policy or default_policy,
            switch_at=self.switch_at if with_switch else None,
            switch_by=self.switch_by if with_switch else None,
        )


def snapshot_order(step: int, kind: SnapshotKind) -> tuple[int, int]:
    """Sort key: step first; at equal steps a Full (or LoRA) outranks an Incremental."""
    return (step, 0 if kind is SnapshotKind.INCREMENTAL else 1)


@dataclass(frozen=True)
class ChainVerdict:
    """The ``ChainValid`` condition's content."""

    status: ConditionStatus
    reason: str
    message: str

    @property
    def valid(self) -> bool:
        return self.status is ConditionStatus.TRUE

    @property
    def broken(self) -> bool:
        return self.status is ConditionStatus.FALSE


@dataclass(frozen=True)
class BreakReport:
    """A replica's chain-breaking failure: which snapshot's files are bad, and why."""

    identity: Identity
    reason: str
    message: str
    pod: str


def _valid(message: str, reason: str = reasons.CHAIN_COMPLETE) -> ChainVerdict:
    return ChainVerdict(ConditionStatus.TRUE, reason, message)


def _broken(reason: str, message: str) -> ChainVerdict:
    return ChainVerdict(ConditionStatus.FALSE, reason, message)


def validate_chains(
    snapshots: Mapping[str, SnapshotInfo], reports: Iterable[BreakReport] = ()
) -> dict[str, ChainVerdict]:
    """Every snapshot's chain verdict; ``snapshots`` holds every one in the namespace."""
    reported: dict[str, BreakReport] = {}
    for report in reports:
        reported.setdefault(report.identity, report)
    verdicts: dict[str, ChainVerdict] = {}
    for identity in sorted(snapshots, key=lambda name: snapshots[name].order):
        _verdict(identity, snapshots, reported, verdicts)
    return verdicts


def _verdict(
    identity: Identity,
    snapshots: Mapping[str, SnapshotInfo],
    reported: Mapping[str, BreakReport],
    verdicts: dict[str, ChainVerdict],
) -> ChainVerdict:
    known = verdicts.get(identity)
    if known is not None:
        return known
    info = snapshots[identity]
    verdict = _own_verdict(info, snapshots, reported, verdicts)
    verdicts[identity] = verdict
    return verdict


def _own_verdict(
    info: SnapshotInfo,
    snapshots: Mapping[str, SnapshotInfo],
    reported: Mapping[str, BreakReport],
    verdicts: dict[str, ChainVerdict],
) -> ChainVerdict:
    if info.recorded is not None and info.recorded.broken:
        return info.recorded
    report = reported.get(info.identity)
    if report is not None:
        return _broken(report.reason, f"replica {report.pod}: {report.message}")
    if info.kind is not SnapshotKind.INCREMENTAL:
        return _valid(f"a {info.kind.value} snapshot starts a chain", reasons.FULL_SNAPSHOT)
    if info.compression_format not in SUPPORTED_COMPRESSION_FORMATS:
        return _broken(
            reasons.MANIFEST_INVALID,
            f"compressionFormat {info.compression_format!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_COMPRESSION_FORMATS))})",
        )
    if info.checksum_format not in SUPPORTED_CHECKSUM_FORMATS:
        return _broken(
            reasons.MANIFEST_INVALID,
            f"checksumFormat {info.checksum_format!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_CHECKSUM_FORMATS))})",
        )
    previous = snapshots.get(info.previous or "")
    if previous is None:
        if info.recorded is not None and info.recorded.valid:
            return info.recorded  # checked while its previous existed; retention removed it
        return ChainVerdict(
            ConditionStatus.UNKNOWN,
            reasons.PREVIOUS_MISSING,
            f"previous snapshot {info.previous} is not in the cluster (yet)",
        )
    if previous.deployment != info.deployment:
        return _broken(
            reasons.CHAIN_BROKEN,
            f"previous snapshot {previous.identity} belongs to deployment {previous.deployment}, "
            f"not {info.deployment}",
        )
    if previous.order >= info.order:
        return _broken(
            reasons.CHAIN_BROKEN,
            f"previous snapshot {previous.identity} (step {previous.step}) does not come before "
            f"this one (step {info.step})",
        )
    before = _verdict(previous.identity, snapshots, reported, verdicts)
    if before.broken:
        return _broken(
            reasons.CHAIN_BROKEN,
            f"previous snapshot {previous.identity} is broken ({before.reason}); "
            "waiting for the next Full",
        )
    if not before.valid:
        return ChainVerdict(ConditionStatus.UNKNOWN, before.reason, before.message)
    return _valid(f"reaches a Full through {previous.identity}")


class TargetMove(StrEnum):
    """How the planned target relates to the observed one."""

    NONE = "None"
    FORWARD = "Forward"
    BACK = "Back"
    """The target was broken (or not a valid snapshot of ours): back to the newest valid."""
    REFRESH = "Refresh"
    """Same identity; the reference's fields (step, kind, cache policy) are repaired."""


@dataclass(frozen=True)
class TargetPlan:
    target: SnapshotRef | None
    move: TargetMove
    previous: SnapshotRef | None


def newest_valid(
    snapshots: Iterable[SnapshotInfo], verdicts: Mapping[str, ChainVerdict], deployment: str
) -> SnapshotInfo | None:
    candidates = [
        info
        for info in snapshots
        if info.deployment == deployment
        and not info.deleting
        and not info.aborted
        and verdicts.get(info.identity, _unknown()).valid
    ]
    return max(candidates, key=lambda info: info.order, default=None)


def _unknown() -> ChainVerdict:
    return ChainVerdict(ConditionStatus.UNKNOWN, reasons.PREVIOUS_MISSING, "")


def plan_target(
    snapshots: Mapping[str, SnapshotInfo],
    verdicts: Mapping[str, ChainVerdict],
    deployment: str,
    observed: SnapshotRef | None,
    default_policy: KvCachePolicy,
) -> TargetPlan:
    """Where the deployment's ``status.targetSnapshot`` should point now."""
    best = newest_valid(snapshots.values(), verdicts, deployment)
    best_ref = best.ref(default_policy) if best is not None else None
    if observed is None:
        return TargetPlan(best_ref, TargetMove.FORWARD if best_ref else TargetMove.NONE, None)
    held = snapshots.get(observed.identity)
    ours = held is not None and held.deployment == deployment
    if (
        held is not None
        and ours
        and not held.aborted
        and verdicts.get(held.identity, _unknown()).valid
    ):
        if best is not None and best.order > held.order:
            return TargetPlan(best_ref, TargetMove.FORWARD, observed)
        repaired = held.ref(default_policy)
        if repaired != observed:
            return TargetPlan(repaired, TargetMove.REFRESH, observed)
        return TargetPlan(observed, TargetMove.NONE, observed)
    # The target is broken, unknown, aborted, another deployment's, or gone.
    if best_ref is None:
        if ours:
            # Broken with nothing valid to return to: hold it; replicas keep their last good.
            return TargetPlan(observed, TargetMove.NONE, observed)
        return TargetPlan(None, TargetMove.BACK, observed)
    forward = best_ref.outranks(observed)
    return TargetPlan(best_ref, TargetMove.FORWARD if forward else TargetMove.BACK, observed)


def breaks_ahead_of(
    snapshots: Iterable[SnapshotInfo],
    verdicts: Mapping[str, ChainVerdict],
    deployment: str,
    target: SnapshotRef | None,
) -> list[SnapshotInfo]:
    """Broken snapshots of the deployment that outrank the target (newest first)."""
    floor = snapshot_order(target.step, target.kind) if target is not None else (-1, -1)
    broken = [
        info
        for info in snapshots
        if info.deployment == deployment
        and verdicts.get(info.identity, _unknown()).broken
        and info.order > floor
    ]
    return sorted(broken, key=lambda info: info.order, reverse=True)
