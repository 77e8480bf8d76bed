"""``hotload gc``: remove the bucket prefixes no retained PolicySnapshot in any region needs.

Each region's operator deletes old PolicySnapshot *objects* (keeping everything back to the
newest Full any replica may still need); the buckets' ``<identity>/`` prefixes are the
publisher's to delete (CONTRACTS.md, "Retention"). What is needed is the union, over every
region, of the retained snapshots of the deployment and their chains back to a Full
(followed through the PolicySnapshots, else through the manifests in the bucket). A region
that does not answer could need anything: then nothing is deleted (:class:`GcRefused`).

Checkpoints. A delta may name a checkpoint (``spec.incremental.checkpoint`` on its
PolicySnapshot, ``checkpoint`` in its manifest): a Full of the same weights as a chain
member ``of``, published beside the chain, with no PolicySnapshot of its own. Walking a
chain back from a retained snapshot, the first checkpoint met (the newest) is needed, and
the walk keeps ``of`` and stops there, as the operator's retention and the sidecar's planner
do: whoever holds nothing of the chain after ``of`` loads the checkpoint and the deltas
after ``of``, so nothing older is needed by anyone following that snapshot. Each retained
snapshot is walked on its own: a lagging region's target that names no checkpoint still
needs its whole chain, even where another region's walk stopped short of it.

A checkpoint just completed is named by no delta yet (the publisher names it in the deltas
it publishes once the checkpoint is complete in every region), and it may stay unnamed for
longer than ``min_age`` while training pauses. So a ``<prefix>-step-<n>-full`` or
``…-checkpoint`` prefix is kept whenever ``n`` is at least the step of the newest complete
snapshot needed (a Full or a checkpoint named so, of step ``m``, ``n >= m``): a Full that
new can only be the next checkpoint, or a Full a new chain starts from. While no complete
snapshot named so is needed at all, every such prefix is kept (nothing says which one is
old).

Only prefixes named like the publisher's identities (``<prefix>-step-…``) are candidates,
and only once older than ``min_age`` (a publish in flight has uploaded files that no
PolicySnapshot names yet). Every distinct regional bucket is cleaned, so copies made by
replication go too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from pydantic import ValidationError

from hotload.api import CheckpointRef, PolicySnapshot
from hotload.errors import GcRefused, HotloadError
from hotload.publish.buckets import BucketOpener, open_region_bucket
from hotload.publish.region_client import RegionBucket
from hotload.publish.results import ResultModel
from hotload.snapshot import MANIFEST_NAME, parse_manifest
from hotload.storage import ObjectInfo, Storage

log = logging.getLogger(__name__)


class GcRegion(Protocol):
    """What gc asks of a region (:class:`~hotload.publish.region_client.RegionClient`)."""

    @property
    def deployment(self) -> str: ...

    def bucket(self, endpoint_override: str | None = None) -> RegionBucket: ...

    def list_snapshots(self) -> list[dict[str, Any]]: ...


class BucketGc(ResultModel):
    """What gc did (or would do) in one bucket."""

    bucket_url: str
    endpoint: str | None = None
    contexts: list[str]
    """The regions that read this bucket."""
    deleted: list[str]
    """Identities whose prefix was removed (or would be, with ``dry_run``)."""
    deleted_bytes: int
    kept_young: list[str]
    """Unneeded, but younger than ``min_age``: left for a later run."""
    kept_recent_fulls: list[str]
    """Named by no retained snapshot, but Fulls (``…-step-<n>-full``) at or after the
    newest complete snapshot needed: perhaps a checkpoint no delta names yet."""


class GcResult(ResultModel):
    needed: list[str]
    """Every identity some region still needs."""
    dry_run: bool
    buckets: list[BucketGc]


@dataclass(frozen=True)
class _Prefix:
    identity: str
    objects: tuple[ObjectInfo, ...]

    @property
    def size(self) -> int:
        return sum(info.size for info in self.objects)

    @property
    def newest(self) -> datetime | None:
        stamps = [info.modified for info in self.objects if info.modified is not None]
        return max(stamps) if stamps else None


@dataclass(frozen=True)
class Link:
    """What gc follows of one snapshot's chain (from its PolicySnapshot or its manifest)."""

    previous: str | None = None
    """The snapshot it applies to; None for a complete one (Full, LoRA): a chain's start."""
    checkpoint: CheckpointRef | None = None
    """The checkpoint it names (deltas only): the newest of its chain."""


def retained_snapshots(items: Iterable[Mapping[str, Any]], deployment: str) -> dict[str, Link]:
    """Identity → chain link of ``deployment``'s PolicySnapshots among ``items`` (raw
    objects; malformed ones are skipped)."""
    found: dict[str, Link] = {}
    for raw in items:
        try:
            snapshot = PolicySnapshot.model_validate(raw)
        except ValidationError:
            continue
        spec = snapshot.spec
        if spec.deployment_ref.name != deployment:
            continue
        incremental = spec.incremental
        found[spec.identity] = (
            Link(incremental.previous_identity, incremental.checkpoint)
            if incremental is not None
            else Link()
        )
    return found


def group_prefixes(objects: Iterable[ObjectInfo], prefix: str) -> list[_Prefix]:
    """The bucket's ``<identity>/`` prefixes whose identity starts with ``<prefix>-step-``."""
    by_identity: dict[str, list[ObjectInfo]] = {}
    for info in objects:
        identity, sep, _ = info.key.partition("/")
        if sep and identity.startswith(f"{prefix}-step-"):
            by_identity.setdefault(identity, []).append(info)
    return [_Prefix(name, tuple(items)) for name, items in sorted(by_identity.items())]


async def _link_from_bucket(storages: Iterable[Storage], identity: str) -> Link | None:
    """A snapshot's link, read from its manifest in the first bucket that has it (None:
    no bucket has a readable one)."""
    for storage in storages:
        try:
            manifest = parse_manifest(
                await storage.get(f"{identity}/{MANIFEST_NAME}"), expected_identity=identity
            )
        except HotloadError:
            continue
        named = manifest.checkpoint
        checkpoint = (
            CheckpointRef(identity=named.identity, of=named.of) if named is not None else None
        )
        return Link(manifest.previous, checkpoint)
    return None


async def _chain(identity: str, link_of: Callable[[str], Awaitable[Link | None]]) -> set[str]:
    """``identity``, its links back to a complete snapshot or to the ``of`` of the first
    checkpoint met on the way (whichever comes first), and that checkpoint."""
    chain: set[str] = set()
    checkpoint: str | None = None
    floor: str | None = None
    current: str | None = identity
    while current is not None and current not in chain:
        chain.add(current)
        if current == floor:
            break
        link = await link_of(current)
        if link is None:
            break
        if floor is None and link.checkpoint is not None:
            checkpoint, floor = link.checkpoint.identity, link.checkpoint.of
        current = link.previous
    return chain if checkpoint is None else chain | {checkpoint}


async def needed_identities(retained: Mapping[str, Link], storages: Iterable[Storage]) -> set[str]:
    """The retained snapshots, every link of their chains back to a complete one or to
    their newest checkpoint's ``of``, and those checkpoints."""
    buckets = list(storages)
    read: dict[str, Link | None] = {}

    async def link_of(identity: str) -> Link | None:
        if identity in retained:
            return retained[identity]
        if identity not in read:  # each manifest read once, however many chains cross it
            read[identity] = await _link_from_bucket(buckets, identity)
        return read[identity]

    needed: set[str] = set()
    for identity in retained:
        needed |= await _chain(identity, link_of)
    return needed


COMPLETE_SUFFIXES: Final = ("-full", "-checkpoint")
"""How the publisher ends the identity of a Full in the chain and of a checkpoint beside it
(``hotload.publish.cadence``)."""


def full_step(identity: str, prefix: str) -> int | None:
    """``n`` of a ``<prefix>-step-<n>-full`` or ``…-checkpoint`` identity (a Full or a
    checkpoint, as the publisher names them); None for any other name."""
    head = f"{prefix}-step-"
    tail = next((t for t in COMPLETE_SUFFIXES if identity.endswith(t)), None)
    if tail is None or not identity.startswith(head):
        return None
    digits = identity[len(head) : len(identity) - len(tail)]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def newest_full_step(needed: Iterable[str], prefix: str) -> int | None:
    """The step of the newest complete snapshot needed that is named like the publisher's
    Fulls and checkpoints; such a prefix at or after it is never deleted."""
    steps = [step for step in (full_step(i, prefix) for i in needed) if step is not None]
    return max(steps, default=None)


async def collect_garbage(
    clients: Mapping[str, GcRegion],
    *,
    prefix: str,
    min_age: timedelta = timedelta(hours=1),
    dry_run: bool = False,
    endpoints: Mapping[str, str] | None = None,
    open_bucket: BucketOpener = open_region_bucket,
    now: datetime | None = None,
) -> GcResult:
    """Delete (or, with ``dry_run``, list) the prefixes nothing retained needs."""
    moment = now or datetime.now(UTC)
    overrides = endpoints or {}
    buckets: dict[str, RegionBucket] = {}
    retained: dict[str, Link] = {}
    unreachable: dict[str, str] = {}
    for context, client in clients.items():
        try:
            buckets[context] = await asyncio.to_thread(client.bucket, overrides.get(context))
            items = await asyncio.to_thread(client.list_snapshots)
        except HotloadError as err:
            unreachable[context] = str(err)
            continue
        retained.update(retained_snapshots(items, client.deployment))
    if unreachable:
        raise GcRefused(
            "a region did not answer: what it still needs is unknown, so nothing is deleted",
            regions=unreachable,
        )
    storages: dict[tuple[str, str | None], Storage] = {}
    readers: dict[tuple[str, str | None], list[str]] = {}
    for context, bucket in buckets.items():
        if bucket.key not in storages:
            storages[bucket.key] = open_bucket(bucket)
        readers.setdefault(bucket.key, []).append(context)
    try:
        needed = await needed_identities(retained, storages.values())
        floor = newest_full_step(needed, prefix)
        results = []
        for key, storage in storages.items():
            cutoff = moment - min_age
            results.append(
                await _clean(storage, key, readers[key], needed, prefix, floor, cutoff, dry_run)
            )
    finally:
        for storage in storages.values():
            await storage.aclose()
    return GcResult(needed=sorted(needed), dry_run=dry_run, buckets=results)


async def _clean(
    storage: Storage,
    key: tuple[str, str | None],
    contexts: list[str],
    needed: set[str],
    prefix: str,
    floor: int | None,
    cutoff: datetime,
    dry_run: bool,
) -> BucketGc:
    deleted: list[str] = []
    young: list[str] = []
    recent_fulls: list[str] = []
    deleted_bytes = 0
    for group in group_prefixes(await storage.list(), prefix):
        if group.identity in needed:
            continue
        step = full_step(group.identity, prefix)
        if step is not None and (floor is None or step >= floor):
            recent_fulls.append(group.identity)
            continue
        newest = group.newest
        if newest is not None and newest.astimezone(UTC) > cutoff:
            young.append(group.identity)
            continue
        if not dry_run:
            # The manifest first: from then on no reader takes the prefix for a snapshot.
            ordered = sorted(group.objects, key=lambda info: not info.key.endswith(MANIFEST_NAME))
            for info in ordered:
                await storage.delete(info.key)
        log.info(
            "bucket prefix removed" if not dry_run else "bucket prefix would be removed",
            extra={"bucket": storage.url, "snapshot": group.identity, "bytes": group.size},
        )
        deleted.append(group.identity)
        deleted_bytes += group.size
    return BucketGc(
        bucket_url=key[0],
        endpoint=key[1],
        contexts=sorted(contexts),
        deleted=deleted,
        deleted_bytes=deleted_bytes,
        kept_young=young,
        kept_recent_fulls=recent_fulls,
    )
