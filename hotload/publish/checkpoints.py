"""The checkpoint lane: a Full of one chain snapshot's weights, published beside the chain.

At the cadence's step the publisher publishes a delta as at every other step, and hands
that step's weights to this lane, which encodes a Full of them and uploads it to every
region's bucket (or the home bucket, then waits for replication to bring each region its
copy) while the deltas go on. Only once the Full is complete everywhere does the worker
record it (:meth:`CheckpointLane.take_outcome`), and from then on each delta names it
(docs/snapshot-format.md, "Checkpoints (v5)"): a replica that starts or falls off the
chain replays from it, and nothing before it is needed any more.

Why a lane of its own: a Full of a large policy takes several training steps to cross a
slow link; in the chain it holds back every delta behind it (bench/freshness). Why a
thread with its own event loop: the worker's loop runs only while a publish runs, and its
storage clients belong to that loop. The lane uploads one part at a time, so the deltas'
own uploads keep most of the link. One checkpoint at a time; a failed one is tried again
from the same weights at the next publish (the weights stay pinned in the work directory
until it is complete), and a restarted publisher resumes it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hotload.errors import HotloadError
from hotload.publish.buckets import BucketOpener
from hotload.publish.delivery import already_uploaded
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.region_client import RegionClient
from hotload.publish.replication import ReplicationWatch
from hotload.publish.state import CheckpointRecord, PendingSnapshot, WorkDir
from hotload.snapshot import MANIFEST_NAME, encode
from hotload.snapshot.publish import upload_snapshot

log = logging.getLogger(__name__)

LANE_UPLOAD_CONCURRENCY: Final = 1
"""Parts the lane uploads at once: one, so that the deltas' uploads share the link with a
single stream of the Full."""


@dataclass(frozen=True)
class LaneSettings:
    home: str | None
    endpoints: Mapping[str, str]
    replication_timeout_s: float
    replication_nudge_after_s: float
    ignored_config_fields: tuple[str, ...]
    open_bucket: BucketOpener


@dataclass(frozen=True)
class LaneOutcome:
    """How one attempt at a checkpoint ended."""

    record: CheckpointRecord
    error: str | None
    """None: complete in every region's bucket."""
    stored_bytes: int
    seconds: float

    @property
    def complete(self) -> bool:
        return self.error is None


class CheckpointLane:
    """Publishes one checkpoint at a time on a thread of its own (see the module doc)."""

    def __init__(
        self, workdir: WorkDir, clients: Mapping[str, RegionClient], settings: LaneSettings
    ) -> None:
        self._workdir = workdir
        self._clients = clients
        self._settings = settings
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._outcome: LaneOutcome | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[LaneOutcome] | None = None

    @property
    def busy(self) -> bool:
        """A checkpoint is on its way (its outcome not taken yet)."""
        with self._lock:
            return self._thread is not None or self._outcome is not None

    def start(self, record: CheckpointRecord) -> bool:
        """Begin publishing ``record``; False (nothing done) while another is busy."""
        with self._lock:
            if self._thread is not None or self._outcome is not None:
                return False
            self._thread = threading.Thread(
                target=self._run, args=(record,), name="hotload-checkpoint", daemon=True
            )
            self._thread.start()
        log.info(
            "publishing a checkpoint beside the chain",
            extra={"checkpoint": record.identity, "of": record.of, "step": record.step},
        )
        return True

    def wait(self, timeout_s: float) -> bool:
        """Wait until no attempt is running; False if one still is after ``timeout_s``."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not thread.is_alive() if thread is not None else True

    def take_outcome(self) -> LaneOutcome | None:
        """The finished attempt's outcome, once (None while running or idle)."""
        with self._lock:
            outcome, self._outcome = self._outcome, None
            return outcome

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop an attempt under way (it resumes from the state at the next start)."""
        with self._lock:
            thread, loop, task = self._thread, self._loop, self._task
        if thread is None:
            return
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout_s)

    def _run(self, record: CheckpointRecord) -> None:
        loop = asyncio.new_event_loop()
        started = time.monotonic()
        outcome = LaneOutcome(record, "stopped before it finished", 0, 0.0)
        try:
            task = loop.create_task(self._publish(record, started))
            with self._lock:
                self._loop, self._task = loop, task
            outcome = loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        except (HotloadError, OSError) as err:
            outcome = LaneOutcome(record, f"{type(err).__name__}: {err}"[:500], 0, _since(started))
            log.warning(
                "the checkpoint failed; it is tried again at the next publish",
                extra={"checkpoint": record.identity, "error": outcome.error},
            )
        finally:
            loop.close()
            with self._lock:
                self._outcome = outcome
                self._thread = self._loop = self._task = None

    async def _publish(self, record: CheckpointRecord, started: float) -> LaneOutcome:
        encoded = self._workdir.encoded(record.identity)
        if not (encoded / MANIFEST_NAME).is_file():
            # On this lane's own thread, not a pool's: a stop waits for the encode to end
            # instead of leaving it writing under the next attempt.
            self._encode(record, encoded)
        buckets = RegionBuckets(
            self._clients,
            home=self._settings.home,
            endpoints=self._settings.endpoints,
            open_bucket=self._settings.open_bucket,
        )
        try:
            stored = await self._upload(record, encoded, buckets)
            await self._wait_for_copies(record, encoded, buckets)
        finally:
            await buckets.aclose()
        outcome = LaneOutcome(record, None, stored, _since(started))
        log.info(
            "checkpoint complete in every region's bucket: later deltas name it",
            extra={
                "checkpoint": record.identity,
                "of": record.of,
                "stored_bytes": stored,
                "seconds": round(outcome.seconds, 3),
            },
        )
        return outcome

    def _encode(self, record: CheckpointRecord, encoded: Path) -> None:
        if encoded.exists():  # an attempt stopped while encoding: start it over
            shutil.rmtree(encoded)
        encode(
            None,
            Path(record.weights),
            encoded,
            identity=record.identity,
            step=record.step,
            ignored_config_fields=self._settings.ignored_config_fields,
        )

    async def _upload(self, record: CheckpointRecord, encoded: Path, buckets: RegionBuckets) -> int:
        """Upload into every bucket a region's snapshots are written to; bytes sent."""
        await buckets.resolve()
        written: set[tuple[str, str | None]] = set()
        sent = 0
        for context in self._clients:
            bucket = buckets.write_bucket(context)  # PublishError while a region is unknown
            if bucket.key in written:
                continue
            written.add(bucket.key)
            storage = buckets.storage(bucket)
            if await already_uploaded(storage, encoded, record.identity):
                continue
            report = await upload_snapshot(
                storage, encoded, record.identity, concurrency=LANE_UPLOAD_CONCURRENCY
            )
            sent += report.bytes
        return sent

    async def _wait_for_copies(
        self, record: CheckpointRecord, encoded: Path, buckets: RegionBuckets
    ) -> None:
        """With replication from the home bucket: until each region's copy arrived (or
        cannot be watched, or the replication timeout passed: its replicas then wait for
        the files themselves, as they do for a late delta)."""
        watch = ReplicationWatch(
            buckets,
            home=self._settings.home,
            timeout_s=self._settings.replication_timeout_s,
            nudge_after_s=self._settings.replication_nudge_after_s,
        )
        item = PendingSnapshot(identity=record.identity, policy_snapshot={}, encoded=str(encoded))
        for context in self._clients:
            landed = watch.lander(context)
            if landed is not None:
                await landed(item)


def _since(started: float) -> float:
    return time.monotonic() - started
