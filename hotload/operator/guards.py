"""Which PolicySnapshots a deletion must not take away now: a pure function.

A snapshot that is its deployment's target, or that some replica serves, carries the
finalizer ``hotload.dev/served``. Deleting it (``kubectl delete psnap``) then only marks it
for deletion: it stays the target, the fleet is not rolled back, and the operator says so
once (an Event, and the annotation ``hotload.dev/deletion-held`` that records it said so).
When it is neither the target nor served any more (a newer snapshot rolled out), the
finalizer is removed and the deletion completes. The finalizer is added with the move that
makes a snapshot the target, before the deployment's status names it.

Kubernetes refuses a new finalizer on an object already marked for deletion: a snapshot
deleted before it was ever guarded is gone as before (the target falls back to the newest
valid snapshot, with its Warning).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hotload.api.labels import DELETION_HELD_ANNOTATION, SERVED_FINALIZER
from hotload.operator.snapshot_status import ObservedSnapshot, precise_time


@dataclass(frozen=True)
class GuardPlan:
    patches: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Identity → metadata merge patch (``finalizers`` whole, ``annotations``)."""
    held: list[str] = field(default_factory=list)
    """Identities whose deletion is held and announced now."""


def plan_guards(
    snapshots: Mapping[str, ObservedSnapshot],
    deployment: str,
    needed: Iterable[str],
    now: datetime,
) -> GuardPlan:
    """The finalizer changes for ``deployment``'s snapshots, given what is ``needed`` (the
    target and every served identity)."""
    wanted = set(needed)
    plan = GuardPlan()
    for identity, observed in sorted(snapshots.items()):
        if observed.info.deployment != deployment:
            continue
        want = identity in wanted
        has = SERVED_FINALIZER in observed.finalizers
        patch: dict[str, Any] = {}
        if want and not has and not observed.info.deleting:
            patch["finalizers"] = [*observed.finalizers, SERVED_FINALIZER]
        elif has and not want:
            patch["finalizers"] = [f for f in observed.finalizers if f != SERVED_FINALIZER]
        if want and has and observed.info.deleting and not observed.deletion_announced:
            patch["annotations"] = {DELETION_HELD_ANNOTATION: precise_time(now)}
            plan.held.append(identity)
        if patch:
            plan.patches[identity] = patch
    return plan
