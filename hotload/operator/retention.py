"""Which PolicySnapshot objects of a deployment may go: a pure function.

Kept: the newest ``keepSnapshots`` (by step, a Full outranking a delta at the same
step), everything newer than the target (it may still become the target), and for the
target and every snapshot a replica serves, its chain back to the Full it starts from (a
replica that restarts or falls behind replays from there; the publisher's ``hotload gc``
keeps the bucket data of what the regions keep). Everything else is deleted, objects
only: the bucket belongs to the publisher.

A chain stops earlier at a checkpoint (``spec.incremental.checkpoint``, a Full of the
same weights as a chain member ``of``, published beside the chain): the first one met
walking back from a snapshot (the newest) is its floor. The sidecar's planner loads that
checkpoint and the deltas after ``of`` for anyone holding nothing of the chain after
``of``, and goes by deltas otherwise, so the walk keeps ``of`` and stops there: nothing
older is needed by anyone who follows that snapshot. The checkpoint itself has no
PolicySnapshot; its bucket prefix is ``hotload gc``'s to keep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hotload.api import SnapshotRef
from hotload.api.kinds import Identity
from hotload.operator.rollout import SnapshotInfo, snapshot_order


def chain_back_to_full(identity: Identity, snapshots: Mapping[str, SnapshotInfo]) -> set[str]:
    """``identity`` and every previous link that exists, back to its Full, or back to
    (and including) the ``of`` of the first checkpoint met on the way, whichever comes
    first. A checkpoint whose ``of`` is not on the walk stops nothing (the chain goes on
    to its Full: keeping more is the safe mistake)."""
    chain: set[str] = set()
    floor: str | None = None
    current = snapshots.get(identity)
    while current is not None and current.identity not in chain:
        chain.add(current.identity)
        if current.identity == floor:
            break
        if floor is None and current.checkpoint is not None:
            floor = current.checkpoint.of
        current = snapshots.get(current.previous) if current.previous else None
    return chain


def plan_retention(
    snapshots: Mapping[str, SnapshotInfo],
    deployment: str,
    keep: int,
    target: SnapshotRef | None,
    served: Iterable[str],
) -> list[str]:
    """Identities of this deployment's snapshots to delete, oldest first."""
    ours = sorted(
        (info for info in snapshots.values() if info.deployment == deployment),
        key=lambda info: info.order,
    )
    kept = {info.identity for info in ours[-keep:]} if keep > 0 else set()
    needed = [*served]
    if target is not None:
        needed.append(target.identity)
        floor = snapshot_order(target.step, target.kind)
        kept |= {info.identity for info in ours if info.order > floor}
    for identity in needed:
        kept |= chain_back_to_full(identity, snapshots)
    return [info.identity for info in ours if info.identity not in kept]
