"""Deliver encoded snapshots to every region: upload to the bucket each region reads (or
the home bucket), then apply the PolicySnapshot there, each region on its own
(:class:`hotload.publish.region_run.RegionRun`); and retry what regions that did not
answer still have queued (``flush``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from hotload.errors import NotFound, PublishConflict
from hotload.publish.observer import Phase, PublishObserver
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.region_client import RegionClient
from hotload.publish.region_run import RegionRun, Upload, WaitSettings
from hotload.publish.replication import ReplicationWatch
from hotload.publish.results import RegionResult
from hotload.publish.state import PendingSnapshot, PublisherState
from hotload.snapshot import MANIFEST_NAME
from hotload.snapshot.publish import UploadReport, upload_snapshot
from hotload.storage import Storage

FLUSH_RETRY_S: Final = 1.0

_Uploads = dict[tuple[tuple[str, str | None], str], "asyncio.Task[UploadReport]"]
"""One upload per (bucket, snapshot) in one round: regions sharing a bucket share it."""


class Delivery:
    """Uploads and applies snapshots in every region, keeping each region's queue in the
    publisher's state."""

    def __init__(
        self,
        *,
        state: PublisherState,
        clients: Mapping[str, RegionClient],
        buckets: RegionBuckets,
        replication: ReplicationWatch,
        observer: PublishObserver,
        wait: WaitSettings,
        upload_concurrency: int,
    ) -> None:
        self._state = state
        self._clients = clients
        self._buckets = buckets
        self._replication = replication
        self._observer = observer
        self._wait = wait
        self._upload_concurrency = upload_concurrency

    async def deliver(
        self,
        identity: str,
        policy_snapshot: dict[str, object],
        encoded: Path,
        started: float,
        *,
        rank_buckets: list[tuple[str, str | None]] | None = None,
    ) -> dict[str, RegionResult]:
        """Every region's outcome for one new snapshot (after what it still had queued).
        ``rank_buckets``: a sharded snapshot, whose ranks wrote their files to these
        buckets only."""
        await self._buckets.resolve()
        uploads: _Uploads = {}
        runs = [self._region_run(context, uploads, started) for context in self._clients]
        item = PendingSnapshot(
            identity=identity,
            policy_snapshot=policy_snapshot,
            encoded=str(encoded),
            rank_buckets=rank_buckets,
        )
        results = await asyncio.gather(*(run.run(item.model_copy()) for run in runs))
        return {result.context: result for result in results}

    async def flush(self, deadline: float, after_round: Callable[[], None]) -> None:
        """Retry the regions with queued snapshots until none is left or ``deadline``;
        ``after_round`` runs after each round (the publisher saves its state)."""
        while True:
            waiting = [c for c, items in self._state.pending.items() if items]
            if not waiting:
                return
            await self._buckets.resolve()
            uploads: _Uploads = {}
            runs = [self._region_run(c, uploads, time.monotonic()) for c in waiting]
            await asyncio.gather(*(run.drain() for run in runs))
            after_round()
            if time.monotonic() >= deadline:
                return
            if any(self._state.pending.get(c) for c in waiting):
                await asyncio.sleep(FLUSH_RETRY_S)

    def _region_run(self, context: str, uploads: _Uploads, started: float) -> RegionRun:
        return RegionRun(
            client=self._clients[context],
            bucket=self._buckets.get(context),
            pending=self._state.pending.setdefault(context, []),
            upload=self._uploader(context, uploads),
            observer=self._observer,
            started=started,
            wait=self._wait,
            landed=self._replication.lander(context),
        )

    def _uploader(self, context: str, uploads: _Uploads) -> Upload:
        async def upload(item: PendingSnapshot, phase: Phase) -> UploadReport | None:
            bucket = self._buckets.write_bucket(context)
            if item.rank_buckets is not None and bucket.key not in item.rank_buckets:
                # Its ranks' files are not in this bucket, and only they had them.
                raise PublishConflict(
                    "the ranks of this sharded snapshot did not write this bucket (its "
                    "region was unknown when it was published): the region gets the next Full",
                    bucket=bucket.bucket_url,
                    snapshot=item.identity,
                )
            key = (bucket.key, item.identity)
            task = uploads.get(key)
            if task is not None:
                await task
                return None
            storage = self._buckets.storage(bucket)

            def progress(done: int, total: int) -> None:
                self._observer.region_progress(context, phase, done, total)

            async def put() -> UploadReport:
                if await already_uploaded(storage, Path(item.encoded), item.identity):
                    return UploadReport(keys=(), bytes=0, seconds=0.0)
                return await upload_snapshot(
                    storage,
                    Path(item.encoded),
                    item.identity,
                    concurrency=self._upload_concurrency,
                    progress=progress,
                )

            task = uploads[key] = asyncio.ensure_future(put())
            return await task

        return upload


async def already_uploaded(storage: Storage, encoded: Path, identity: str) -> bool:
    """True when the bucket holds exactly this snapshot already (a retry after a crash);
    a different snapshot under the identity is a :class:`PublishConflict`: a published
    snapshot is never overwritten (replicas may be reading it)."""
    try:
        stored = await storage.get(f"{identity}/{MANIFEST_NAME}")
    except NotFound:
        return False
    if stored == (encoded / MANIFEST_NAME).read_bytes():
        return True
    raise PublishConflict(
        "the bucket already holds another snapshot of this identity: "
        "published snapshots are never overwritten",
        bucket=storage.url,
        snapshot=identity,
    )
