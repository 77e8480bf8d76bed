"""Where buckets replicate from the home bucket: wait until a region's copy of a snapshot
is complete before its PolicySnapshot is applied, so its replicas never look for files
that are still on their way; and write files replication is late with again."""

from __future__ import annotations

import logging
import time
from enum import Enum
from pathlib import Path
from typing import Final

from hotload.errors import HotloadError, NotFound
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.region_run import Landed
from hotload.publish.state import PendingSnapshot
from hotload.snapshot import MANIFEST_NAME, read_manifest
from hotload.waiting import wait_until_async

log = logging.getLogger(__name__)

REPLICATION_POLL_S: Final = 0.2
REPLICATION_POLL_MAX_S: Final = 2.0


class _Copy(Enum):
    ARRIVED = "arrived"
    BLIND = "blind"


class ReplicationWatch:
    """Watches each region's copy arrive (HEAD requests through its own endpoint)."""

    def __init__(
        self,
        buckets: RegionBuckets,
        *,
        home: str | None,
        timeout_s: float,
        nudge_after_s: float,
    ) -> None:
        self._buckets = buckets
        self._home = home
        self._timeout_s = timeout_s
        self._nudge_after_s = nudge_after_s

    def lander(self, context: str) -> Landed | None:
        """The wait for ``context``'s copy; None where the region's bucket is written
        directly."""
        if self._home is None or context == self._home:
            return None

        async def landed(item: PendingSnapshot) -> bool:
            return await self._landed(context, item)

        return landed

    async def _landed(self, context: str, item: PendingSnapshot) -> bool:
        bucket = self._buckets.get(context)
        if bucket is None or self._buckets.write_bucket(context).key == bucket.key:
            return True
        storage = self._buckets.storage(bucket)
        missing = {f"{item.identity}/{rel}" for rel in _listed(Path(item.encoded))}
        nudge_after = self._nudge_after_s
        deadline = time.monotonic() + self._timeout_s
        nudge_at = time.monotonic() + nudge_after if nudge_after > 0 else None

        async def arrived() -> _Copy | None:
            """ARRIVED once every file is there; BLIND when the replica cannot be read."""
            nonlocal nudge_at
            for key in sorted(missing):
                try:
                    await storage.stat(key)
                except NotFound:
                    continue
                except HotloadError as err:
                    # No access to the replica (credentials for the home bucket only):
                    # the replicas will wait for their files themselves.
                    log.info(
                        "cannot watch the region's copy arrive",
                        extra={"context": context, "error": str(err)[:200]},
                    )
                    return _Copy.BLIND
                missing.discard(key)
            if not missing:
                return _Copy.ARRIVED
            if nudge_at is not None and nudge_at <= time.monotonic() < deadline:
                await self._nudge(context, item, sorted(missing))
                nudge_at = time.monotonic() + 2 * nudge_after
            return None

        copy = await wait_until_async(
            arrived,
            self._timeout_s,
            interval_s=REPLICATION_POLL_S,
            growth=1.5,
            max_interval_s=REPLICATION_POLL_MAX_S,
        )
        if copy is None:
            log.warning(
                "replication has not brought the region its copy yet; applying",
                extra={"context": context, "snapshot": item.identity},
            )
        return copy is _Copy.ARRIVED

    async def _nudge(self, context: str, item: PendingSnapshot, missing: list[str]) -> None:
        """Write the files a region still lacks into the home bucket again: a new version
        of each, which replication sends at once (the failed one waits in MinIO's retry
        queue). The bytes cross the home link again, and each other region's link once
        more: only in this rare case, and only for the missing files."""
        log.warning(
            "replication is late; writing the missing files into the home bucket again",
            extra={"context": context, "snapshot": item.identity, "files": len(missing)},
        )
        storage = self._buckets.storage(self._buckets.write_bucket(context))
        encoded = Path(item.encoded)
        for key in missing:
            relative = key.removeprefix(f"{item.identity}/")
            if not (encoded / relative).is_file():
                continue  # another rank's file (a sharded snapshot): replication only
            try:
                await storage.put_file(key, encoded / relative)
            except (HotloadError, OSError) as err:
                log.info(
                    "could not write a late file again; waiting for replication",
                    extra={"context": context, "key": key, "error": str(err)[:200]},
                )
                return


def _listed(encoded: Path) -> list[str]:
    """Every file of the snapshot, the manifest included: those its manifest lists (a
    sharded snapshot's encoded directory holds only the coordinator's own files)."""
    return [*read_manifest(encoded).files_to_fetch(), MANIFEST_NAME]
