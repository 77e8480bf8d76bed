"""Chain planning: from what a replica holds to a target, the cheapest way, from manifests.

Pure logic over manifests (no I/O): the sidecar loads manifests one by one, walking
``previous`` links from the target (:func:`next_manifest_needed` says which one to load
next, :func:`plan_update_with` does the walk through a loader), and applies the plan.

The paths, cheapest first: the deltas after the snapshot the replica holds (``delta``);
the target itself when it is a Full or LoRA (``full``); otherwise the chain replayed
from its last Full (``replay``). A chain that cannot be followed — a missing manifest, a
cycle, a ``previous`` that is not older, names a LoRA, or whose tensors are not the ones
the delta was made against — is :class:`~hotload.errors.ChainBroken`.

A delta may name a *checkpoint* (format v5): a Full of the same weights as an older
snapshot of its chain (``of``), published beside the chain. The first checkpoint the walk
meets (the newest) is the chain's floor, as its last Full would be: a replica holding
``of`` or a later snapshot of the chain applies the deltas; any other replays from the
checkpoint, whose tensor-set digest must equal the ``previousDigest`` of the delta that
applies to ``of`` (else the chain is broken: a checkpoint of other weights is never
loaded). Nothing older than ``of`` is read, so it may be deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hotload.api import LoadPath, SnapshotKind
from hotload.api.kinds import Identity
from hotload.errors import ChainBroken
from hotload.snapshot.digest import tensor_set_digest
from hotload.snapshot.manifest import Manifest, ManifestCheckpoint


@dataclass(frozen=True)
class UpdatePlan:
    """Snapshots to apply, in order, to go from ``held`` to ``target``."""

    via: LoadPath
    apply: tuple[str, ...]
    """Identities in order. ``via`` full or replay: the first is a Full (or LoRA) loaded
    from nothing; ``via`` delta: each applies to the one before, the first to ``held``.
    Empty when the replica already holds the target."""
    fetch_bytes: int
    """Bytes of stored files to download (manifests not counted)."""

    @property
    def up_to_date(self) -> bool:
        return not self.apply


class _Missing(Exception):
    def __init__(self, identity: Identity) -> None:
        self.identity = identity


def manifest_digest(manifest: Manifest) -> str:
    """The digest of a snapshot's rebuilt tensors, as a later delta's ``previousDigest``."""
    return tensor_set_digest((t.name, t.hash) for t in manifest.tensors)


def _walk(held: str | None, target: str, manifests: Mapping[str, Manifest]) -> UpdatePlan:
    chain: list[Manifest] = []
    seen: set[str] = set()
    identity = target
    floor: ManifestCheckpoint | None = None
    while True:
        if identity in seen:
            raise ChainBroken("the chain has a cycle", target=target, identity=identity)
        seen.add(identity)
        if identity == held:
            steps = tuple(m.identity for m in reversed(chain))
            return UpdatePlan(LoadPath.DELTA, steps, sum(m.stored_bytes() for m in chain))
        manifest = manifests.get(identity)
        if manifest is None:
            raise _Missing(identity)
        if manifest.identity != identity:
            raise ChainBroken(
                "a manifest names another identity",
                expected=identity,
                found=manifest.identity,
            )
        chain.append(manifest)
        if manifest.kind is not SnapshotKind.INCREMENTAL:
            via = LoadPath.FULL if len(chain) == 1 else LoadPath.REPLAY
            steps = tuple(m.identity for m in reversed(chain))
            return UpdatePlan(via, steps, sum(m.stored_bytes() for m in chain))
        previous = manifest.previous
        if previous is None:  # the Manifest model already refuses this
            raise ChainBroken("an Incremental snapshot names no previous", identity=identity)
        floor = floor or manifest.checkpoint
        if floor is not None and previous == floor.of and previous != held:
            return _from_checkpoint(floor, chain, manifests)
        before = manifests.get(previous)
        if before is not None:
            _check_link(manifest, before)
        identity = previous


def _from_checkpoint(
    checkpoint: ManifestCheckpoint,
    chain: list[Manifest],
    manifests: Mapping[str, Manifest],
) -> UpdatePlan:
    """The plan through ``checkpoint``: ``chain`` (newest first) ends with the delta that
    applies to ``checkpoint.of``."""
    full = manifests.get(checkpoint.identity)
    if full is None:
        raise _Missing(checkpoint.identity)
    after = chain[-1]
    if full.identity != checkpoint.identity:
        raise ChainBroken(
            "a manifest names another identity",
            expected=checkpoint.identity,
            found=full.identity,
        )
    if full.kind is not SnapshotKind.FULL:
        raise ChainBroken(
            "a checkpoint is not a Full snapshot",
            checkpoint=checkpoint.identity,
            kind=full.kind.value,
        )
    if full.step >= after.step:
        raise ChainBroken(
            "a checkpoint is not older than the delta after the snapshot it is of",
            checkpoint=checkpoint.identity,
            step=full.step,
            delta=after.identity,
            delta_step=after.step,
        )
    if manifest_digest(full) != after.previous_digest:
        raise ChainBroken(
            "a checkpoint holds other weights than the snapshot it is of",
            checkpoint=checkpoint.identity,
            of=checkpoint.of,
            delta=after.identity,
        )
    steps = (checkpoint.identity, *(m.identity for m in reversed(chain)))
    return UpdatePlan(
        LoadPath.REPLAY, steps, full.stored_bytes() + sum(m.stored_bytes() for m in chain)
    )


def _check_link(delta: Manifest, before: Manifest) -> None:
    if before.kind is SnapshotKind.LORA:
        raise ChainBroken(
            "a delta names a LoRA adapter as its previous",
            identity=delta.identity,
            previous=before.identity,
        )
    if before.step >= delta.step:
        raise ChainBroken(
            "a delta's previous snapshot is not older than it",
            identity=delta.identity,
            previous=before.identity,
            step=delta.step,
            previous_step=before.step,
        )
    if manifest_digest(before) != delta.previous_digest:
        raise ChainBroken(
            "a delta was made against other weights than its previous snapshot's",
            identity=delta.identity,
            previous=before.identity,
        )


def plan_update(held: str | None, target: str, manifests: Mapping[str, Manifest]) -> UpdatePlan:
    """The cheapest plan from ``held`` (None: nothing loaded) to ``target``.

    ``manifests`` maps identities to their manifests; it must hold the target's and
    every manifest back to the replica's snapshot or the chain's last Full, else
    :class:`ChainBroken` names the missing one.
    """
    try:
        return _walk(held, target, manifests)
    except _Missing as missing:
        raise ChainBroken(
            "a snapshot of the chain has no manifest",
            target=target,
            missing=missing.identity,
        ) from None


def next_manifest_needed(
    held: str | None, target: str, manifests: Mapping[str, Manifest]
) -> str | None:
    """The identity whose manifest the walk needs next, or None once a plan can be made.

    Raises :class:`ChainBroken` for a chain already known to be broken (cycle, wrong
    previous), so a caller never loads manifests for a plan that cannot exist.
    """
    try:
        _walk(held, target, manifests)
    except _Missing as missing:
        return missing.identity
    return None


def plan_update_with(held: str | None, target: str, load: Callable[[str], Manifest]) -> UpdatePlan:
    """Like :func:`plan_update`, loading each manifest it needs through ``load``.

    ``load`` raises what the storage raises (``NotFound`` is transient: replication may
    deliver a manifest late); its errors pass through unchanged.
    """
    manifests: dict[str, Manifest] = {}
    while (identity := next_manifest_needed(held, target, manifests)) is not None:
        manifests[identity] = load(identity)
    return plan_update(held, target, manifests)
