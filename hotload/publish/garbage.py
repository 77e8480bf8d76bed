"""``hotload gc``: remove the bucket prefixes no retained PolicySnapshot in any region needs.

Each region's operator deletes old PolicySnapshot *objects* (keeping everything back to the
newest Full any replica may still need); the buckets' ``<identity>/`` prefixes are the
publisher's to delete (CONTRACTS.md, "Retention"). What is needed is the union, over every
region, of the retained snapshots of the deployment and their chains back to a Full
(followed through the PolicySnapshots, else through the manifests in the bucket). A region
that does not answer could need anything: then nothing is deleted (:class:`GcRefused`).

Only prefixes named like the publisher's identities (``<prefix>-step-…``) are candidates,
and only once older than ``min_age`` (a publish in flight has uploaded files that no
PolicySnapshot names yet). Every distinct regional bucket is cleaned, so copies made by
replication go too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from hotload.api import PolicySnapshot
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


def retained_snapshots(
    items: Iterable[Mapping[str, Any]], deployment: str
) -> dict[str, str | None]:
    """Identity → previous identity (None for complete snapshots) of ``deployment``'s
    PolicySnapshots among ``items`` (raw objects; malformed ones are skipped)."""
    found: dict[str, str | None] = {}
    for raw in items:
        try:
            snapshot = PolicySnapshot.model_validate(raw)
        except ValidationError:
            continue
        spec = snapshot.spec
        if spec.deployment_ref.name != deployment:
            continue
        found[spec.identity] = spec.incremental.previous_identity if spec.incremental else None
    return found


def group_prefixes(objects: Iterable[ObjectInfo], prefix: str) -> list[_Prefix]:
    """The bucket's ``<identity>/`` prefixes whose identity starts with ``<prefix>-step-``."""
    by_identity: dict[str, list[ObjectInfo]] = {}
    for info in objects:
        identity, sep, _ = info.key.partition("/")
        if sep and identity.startswith(f"{prefix}-step-"):
            by_identity.setdefault(identity, []).append(info)
    return [_Prefix(name, tuple(items)) for name, items in sorted(by_identity.items())]


async def _previous_from_bucket(storages: Iterable[Storage], identity: str) -> str | None:
    """A snapshot's previous identity, read from its manifest in the first bucket that has it."""
    for storage in storages:
        try:
            manifest = parse_manifest(
                await storage.get(f"{identity}/{MANIFEST_NAME}"), expected_identity=identity
            )
        except HotloadError:
            continue
        return manifest.previous
    return None


async def needed_identities(
    retained: Mapping[str, str | None], storages: Iterable[Storage]
) -> set[str]:
    """The retained snapshots and every link of their chains back to a complete one."""
    needed: set[str] = set()
    buckets = list(storages)
    for identity in retained:
        current: str | None = identity
        while current is not None and current not in needed:
            needed.add(current)
            if current in retained:
                current = retained[current]
            else:
                current = await _previous_from_bucket(buckets, current)
    return needed


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
    retained: dict[str, str | None] = {}
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
        results = []
        for key, storage in storages.items():
            results.append(
                await _clean(storage, key, readers[key], needed, prefix, moment - min_age, dry_run)
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
    cutoff: datetime,
    dry_run: bool,
) -> BucketGc:
    deleted: list[str] = []
    young: list[str] = []
    deleted_bytes = 0
    for group in group_prefixes(await storage.list(), prefix):
        if group.identity in needed:
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
    )
