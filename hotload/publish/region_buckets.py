"""The regions' buckets as one publisher knows them: learnt from each region's
RolloutDeployment once it answers, opened once each (two regions naming the same bucket
share one storage), and which one a region's snapshots are written to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from hotload.errors import HotloadError, PublishError
from hotload.publish.buckets import BucketOpener
from hotload.publish.region_client import RegionBucket, RegionClient
from hotload.storage import Storage

log = logging.getLogger(__name__)


class RegionBuckets:
    """Each region's bucket (once known) and the storages open on them."""

    def __init__(
        self,
        clients: Mapping[str, RegionClient],
        *,
        home: str | None,
        endpoints: Mapping[str, str],
        open_bucket: BucketOpener,
    ) -> None:
        self._clients = clients
        self._home = home
        self._endpoints = endpoints
        self._open_bucket = open_bucket
        self._buckets: dict[str, RegionBucket] = {}
        self._storages: dict[tuple[str, str | None], Storage] = {}

    def get(self, context: str) -> RegionBucket | None:
        """The region's own bucket, or None while its RolloutDeployment was not read."""
        return self._buckets.get(context)

    async def resolve(self) -> None:
        """Learn each region's bucket from its RolloutDeployment (once it answers)."""

        async def resolve(context: str) -> None:
            override = self._endpoints.get(context)
            try:
                bucket = await asyncio.to_thread(self._clients[context].bucket, override)
            except HotloadError as err:
                log.warning(
                    "cannot read the region's RolloutDeployment",
                    extra={"context": context, "error": str(err)[:300]},
                )
                return
            self._buckets[context] = bucket

        missing = [c for c in self._clients if c not in self._buckets]
        await asyncio.gather(*(resolve(context) for context in missing))

    def write_bucket(self, context: str) -> RegionBucket:
        """The bucket a region's snapshots are written to: its own, or the home one."""
        source = self._home or context
        bucket = self._buckets.get(source)
        if bucket is None:
            raise PublishError(
                "the bucket to write is unknown: its region's RolloutDeployment was not read",
                context=source,
            )
        return bucket

    def storage(self, bucket: RegionBucket) -> Storage:
        storage = self._storages.get(bucket.key)
        if storage is None:
            storage = self._storages[bucket.key] = self._open_bucket(bucket)
        return storage

    async def aclose(self) -> None:
        for storage in self._storages.values():
            await storage.aclose()
        self._storages.clear()
