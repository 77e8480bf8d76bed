"""The trainer's publisher: ``Publisher(...).publish(state_dict_or_directory, step)``.

The training loop calls :meth:`Publisher.publish` and gets control back as soon as its
weights are copied to host memory (``PublishResult.blocked_seconds`` says how long that
took); everything else runs on the publisher's own worker thread
(:mod:`~hotload.publish.worker`), one snapshot at a time in step order:

1. choose Full or Incremental (:mod:`~hotload.publish.deciding`, the rules of
   :mod:`~hotload.publish.cadence`: cadence, on demand, and after any region reported
   ``ChainValid=False``);
2. encode in this process (:mod:`~hotload.publish.encoding`, the codec's own threads),
   against the previous snapshot's weights kept in the work directory;
3. upload with parallel (multipart) writes, the manifest last, to every region's bucket
   (:mod:`~hotload.publish.region_buckets`: each learnt from that region's
   RolloutDeployment), or only to the home region's bucket when the buckets replicate
   from it (``home``; each other region's snapshot is then applied once replication
   brought it every file, or after ``replication_timeout_s``:
   :mod:`~hotload.publish.replication`);
4. apply the PolicySnapshot in every region, each region on its own
   (:mod:`~hotload.publish.delivery`): one that does not answer keeps its snapshots
   queued (in order, in the work directory's state) and gets them with the next publish
   or :meth:`Publisher.flush`;
5. where the regions' deployments are Coordinated (``spec.rollout.switch``), decide the
   fleet's switch time once every replica is Staged and write it on every region's snapshot
   (:mod:`~hotload.publish.switching`), while the snapshot is delivered;
6. optionally wait until it is Ready in every region; a region that reports the chain
   broken gets, at once, a Full of the same weights (``PublishResult.fallback``; with
   ``fallback_full=False`` the next publish is that Full instead);
7. remember the snapshot as the next one's base and tidy the work directory
   (:mod:`~hotload.publish.tidying`);
8. at the cadence's step (``checkpoints``, the default for one process), hand the step's
   weights to the checkpoint lane (:mod:`~hotload.publish.checkpoints`), which publishes a
   Full of them *beside* the chain while the deltas go on; once it is complete in every
   region's bucket, each later delta names it (format v5) and the regions' retention and
   ``hotload gc`` drop the chain before it.

``max_pending`` publishes may wait behind the running one; a publish that finds them
all waiting takes the place of the oldest (:mod:`~hotload.publish.newest`): when the
trainer is faster than the links the newest step goes out and stale ones are skipped
(``PublishResult.skipped_steps``, ``hotload_publisher_skipped_steps_total``), so the
training loop is held for the host copy only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from hotload.api import SnapshotKind
from hotload.errors import HotloadError, PublishError
from hotload.publish.buckets import BucketOpener, open_region_bucket
from hotload.publish.cadence import checkpoint_identity_for, identity_for
from hotload.publish.checkpoints import CheckpointLane, LaneOutcome, LaneSettings
from hotload.publish.commit import RoundTiming
from hotload.publish.deciding import KindChooser
from hotload.publish.delivery import Delivery
from hotload.publish.encoding import EncodeSettings, encode_step
from hotload.publish.metrics import PublisherMetrics
from hotload.publish.newest import PendingPublish
from hotload.publish.observer import NullObserver, PublishObserver
from hotload.publish.policy_object import policy_snapshot
from hotload.publish.ranks import join_ranks
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.region_client import RegionClient
from hotload.publish.region_run import WaitSettings
from hotload.publish.replication import ReplicationWatch
from hotload.publish.results import (
    CheckpointResult,
    PublishResult,
    RegionOutcome,
    RegionResult,
    SwitchResult,
)
from hotload.publish.settings import PublisherSettings
from hotload.publish.state import CheckpointRecord, PublisherState, WorkDir
from hotload.publish.switching import SwitchCoordinator
from hotload.publish.tidying import remember, tidy
from hotload.publish.weights import CapturedWeights, capture
from hotload.publish.worker import SerialWorker
from hotload.snapshot import ManifestCheckpoint, manifest_digest

if TYPE_CHECKING:
    from hotload.publish.sharded_side import ShardedSide
    from hotload.publish.sharding import HeldWeights

__all__ = ["PublishHandle", "Publisher", "PublisherSettings"]

log = logging.getLogger(__name__)


class PublishHandle:
    """A publish under way: ``result()`` waits for it."""

    def __init__(self, future: Future[PublishResult], step: int, blocked_seconds: float) -> None:
        self._future = future
        self.step = step
        self.blocked_seconds = blocked_seconds

    def result(self, timeout: float | None = None) -> PublishResult:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()


class Publisher:
    """Publishes snapshots of one deployment to every region (see the module docstring)."""

    def __init__(
        self,
        settings: PublisherSettings,
        *,
        observer: PublishObserver | None = None,
        open_bucket: BucketOpener = open_region_bucket,
        registry: CollectorRegistry | None = None,
        distributed: bool = False,
        process_group: Any | None = None,
    ) -> None:
        """``registry``: where the publisher's metrics go (``hotload_publisher_*``; a
        private registry when none is given). ``distributed`` (or a ``process_group``):
        this is one rank of a sharded trainer's publisher (docs/publishing.md, "From every
        rank of a sharded trainer"); every rank of the group constructs one with the same
        settings."""
        self.settings = settings
        self.metrics = PublisherMetrics(registry or CollectorRegistry(auto_describe=True))
        self._observer = observer or NullObserver()
        self._ranks = (
            join_ranks(settings.namespace, settings.deployment, process_group)
            if distributed or process_group is not None
            else None
        )
        coordinating = self._ranks is None or self._ranks.coordinator
        self._workdir = WorkDir(settings.workdir)
        if coordinating:
            self._workdir.lock()
            try:
                self._state = self._workdir.load(settings.deployment, settings.namespace)
            except BaseException:
                self._workdir.unlock()
                raise
        else:  # the coordinator alone holds the state and talks to the regions
            self._state = PublisherState(
                deployment=settings.deployment, namespace=settings.namespace
            )
        self._clients = {
            context: RegionClient(
                context, settings.kubeconfig, settings.namespace, settings.deployment
            )
            for context in (settings.contexts if coordinating else ())
        }
        self._buckets = RegionBuckets(
            self._clients,
            home=settings.home,
            endpoints=settings.endpoints,
            open_bucket=open_bucket,
        )
        self._chooser = KindChooser(
            self._state,
            self._clients,
            settings.full_every,
            checkpoints=settings.checkpoints and self._ranks is None,
        )
        self._lane = (
            CheckpointLane(
                self._workdir,
                self._clients,
                LaneSettings(
                    home=settings.home,
                    endpoints=settings.endpoints,
                    replication_timeout_s=settings.replication_timeout_s,
                    replication_nudge_after_s=settings.replication_nudge_after_s,
                    ignored_config_fields=settings.ignored_config_fields,
                    open_bucket=open_bucket,
                ),
            )
            if self._ranks is None
            else None
        )
        self._delivery = Delivery(
            state=self._state,
            clients=self._clients,
            buckets=self._buckets,
            replication=ReplicationWatch(
                self._buckets,
                home=settings.home,
                timeout_s=settings.replication_timeout_s,
                nudge_after_s=settings.replication_nudge_after_s,
            ),
            observer=self._observer,
            wait=WaitSettings(settings.wait, settings.wait_timeout_s, settings.unreachable_after_s),
            upload_concurrency=settings.upload_concurrency,
        )
        self._switching = SwitchCoordinator(self._clients, self._state)
        self._sharded = self._join(open_bucket) if self._ranks is not None else None
        self._closed = False
        self._worker = SerialWorker(
            max_pending=settings.max_pending,
            name="hotload-publisher",
            finish=self._buckets.aclose,
        )

    def _join(self, open_bucket: BucketOpener) -> ShardedSide:
        """This rank's side of the sharded publisher (imports torch)."""
        from hotload.publish.sharded_side import ShardedSide

        assert self._ranks is not None
        return ShardedSide.join(
            self.settings,
            self._ranks,
            open_bucket=open_bucket,
            coordinator_parts=(
                self._workdir,
                self._state,
                self._chooser,
                self._buckets,
                self._deliver,
                self._observer,
            ),
        )

    # --- the training loop's side ---------------------------------------------------

    def publish(
        self, weights: Mapping[str, Any] | Path, step: int, *, full: bool = False
    ) -> PublishHandle:
        """Publish the weights of ``step`` (a state_dict, or a safetensors directory).

        Returns once the weights are copied; the handle's ``result()`` waits for the
        outcome in every region. When the publisher is behind, a newer publish may
        replace this one before it starts: ``result()`` is then the newer snapshot's
        (its ``step`` is later and its ``skipped_steps`` name this one).
        """
        if self._closed:
            raise PublishError("the publisher is closed")
        timing = RoundTiming(started=time.monotonic())
        if self._sharded is not None:
            sharded = self._sharded
            # A rank that cannot capture still takes its turn in the round (posting its
            # error), so that every rank hears the same outcome instead of waiting on it.
            held: HeldWeights | HotloadError
            try:
                held = sharded.capture(weights, self.settings.dtype)
            except HotloadError as err:
                held = err
            timing.blocked_seconds = time.monotonic() - timing.started
            self.metrics.offered(step)
            wants_full = full or sharded.take_full_request()

            async def round_work() -> PublishResult:
                result = await sharded.rounds.publish(step, held, wants_full, timing)
                self.metrics.published(result)
                return result

            # Never skipped (no tag): every rank must publish the same steps in turn.
            future = self._worker.submit(round_work)
            timing.blocked_seconds = time.monotonic() - timing.started
            self.metrics.blocked(timing.blocked_seconds)
            return PublishHandle(future, step, timing.blocked_seconds)
        pending = PendingPublish(step, capture(weights, self.settings.dtype), full)
        timing.blocked_seconds = time.monotonic() - timing.started
        self.metrics.offered(step)

        async def work() -> PublishResult:
            captured = pending.captured
            assert captured is not None  # dropped only from a publish that was replaced
            pending.captured = None  # the worker's reference is the last one
            return await self._publish(
                pending.step, captured, pending.full, timing, skipped=pending.skipped_steps
            )

        future = self._worker.submit(work, pending)
        timing.blocked_seconds = time.monotonic() - timing.started
        self.metrics.blocked(timing.blocked_seconds)
        return PublishHandle(future, step, timing.blocked_seconds)

    def request_full(self) -> None:
        """Make the next snapshot a Full (on any rank of a sharded publisher)."""
        if self._sharded is not None:
            self._sharded.request_full()
        self._chooser.full_requested.set()

    def flush(self, timeout_s: float = 60.0) -> dict[str, list[str]]:
        """Retry the snapshots still queued for regions that did not answer, until none is
        left or ``timeout_s`` passed; returns what is still queued, by context."""
        deadline = time.monotonic() + timeout_s

        async def work() -> dict[str, list[str]]:
            await self._delivery.flush(deadline, lambda: tidy(self._workdir, self._state))
            await self._switching.retry()
            tidy(self._workdir, self._state)
            return self.pending()

        return self._worker.submit(work).result()

    def pending(self) -> dict[str, list[str]]:
        """Snapshots not applied yet, by context (a snapshot of the worker's state)."""
        return {
            context: [item.identity for item in items]
            for context, items in self._state.pending.items()
            if items
        }

    def wait_for_checkpoint(self, timeout_s: float = 600.0) -> bool:
        """Wait until no checkpoint is on its way beside the chain (its outcome is taken
        by the next publish); False if one still is after ``timeout_s``."""
        return self._lane.wait(timeout_s) if self._lane is not None else True

    def close(self) -> None:
        """Finish the queued publishes, then stop the worker and release the work directory.
        A checkpoint still on its way is stopped; the next publisher on this work directory
        resumes it."""
        if self._closed:
            return
        self._closed = True
        self._worker.close()
        if self._lane is not None:
            self._lane.close()
            # The worker has stopped: the state is this thread's now. A checkpoint that
            # finished is recorded, so the next publisher's first delta names it.
            outcome = self._lane.take_outcome()
            if outcome is not None and self._ranks is None:
                self._take_outcome(outcome)
        if self._sharded is not None:
            self._sharded.close()
        for client in self._clients.values():
            client.close()
        self._workdir.unlock()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the worker -------------------------------------------------------------------

    async def _deliver(
        self,
        identity: str,
        policy: dict[str, Any],
        encoded: Path,
        timing: RoundTiming,
        rank_buckets: list[tuple[str, str | None]] | None = None,
    ) -> tuple[dict[str, RegionResult], SwitchResult | None]:
        """Deliver to every region and, where the regions coordinate their switch, decide
        it meanwhile (the regions' waits for Ready end only after it). ``rank_buckets``:
        a sharded snapshot's (see :meth:`Delivery.deliver`)."""
        await self._switching.retry()
        fleet = await self._switching.fleet()
        if fleet is None:
            regions = await self._delivery.deliver(
                identity, policy, encoded, timing.started, rank_buckets=rank_buckets
            )
            return regions, None
        deadline = self._switching.stamp(policy, fleet, datetime.now(UTC))
        switching = asyncio.ensure_future(
            self._switching.coordinate(identity, fleet, deadline, timing.started)
        )
        try:
            regions = await self._delivery.deliver(
                identity, policy, encoded, timing.started, rank_buckets=rank_buckets
            )
        except BaseException:
            switching.cancel()  # undecided: every region presumes at the deadline
            raise
        return regions, await switching

    async def _publish(
        self,
        step: int,
        captured: CapturedWeights,
        full: bool,
        timing: RoundTiming,
        why: str | None = None,
        skipped: list[int] | None = None,
    ) -> PublishResult:
        settings = self.settings
        if skipped:
            log.warning(
                "the publisher fell behind: publishing the newest step, skipping older ones",
                extra={"step": step, "skipped_steps": skipped},
            )
        checkpoints_done = self._settle_checkpoints()
        decision = await self._chooser.choose(step, full=full, lora=captured.is_lora)
        identity = identity_for(settings.prefix, step, decision.kind)
        previous = self._state.last
        incremental = decision.kind is SnapshotKind.INCREMENTAL
        named = self._state.named_checkpoint() if incremental else None
        begin = decision.checkpoint and self._state.checkpoint_pending is None
        encoded = await asyncio.to_thread(
            encode_step,
            self._workdir,
            captured,
            identity=identity,
            step=step,
            previous=(
                (decision.previous, Path(previous.weights))
                if previous and decision.previous
                else None
            ),
            settings=EncodeSettings(
                settings.files_from, settings.ignored_config_fields, settings.encode_threads
            ),
            checkpoint=ManifestCheckpoint(identity=named.identity, of=named.of) if named else None,
        )
        kind = encoded.result.manifest.kind
        self._observer.snapshot_encoded(
            identity, kind, step, encoded.result.stored_bytes, encoded.result.tensor_bytes
        )
        policy = policy_snapshot(
            settings, identity, step, kind, decision.previous, encoded.result.manifest.format,
            manifest_digest(encoded.result.manifest),
            (named.identity, named.of) if named else None,
        )  # fmt: skip
        regions, switch = await self._deliver(identity, policy, encoded.directory, timing)
        remember(self._state, identity, step, kind, encoded.weights, checkpoint_begun=begin)
        self._chooser.chain_broken = False
        begun = self._begin_checkpoint(identity, step, encoded.weights) if begin else None
        tidy(self._workdir, self._state)
        if begun is not None and self._lane is not None:
            self._lane.start(begun)
        result = PublishResult(
            identity=identity,
            step=step,
            kind=kind,
            previous=decision.previous,
            why=why or (decision.why if begin or not decision.checkpoint else "delta"),
            stored_bytes=encoded.result.stored_bytes,
            full_bytes=encoded.result.tensor_bytes,
            blocked_seconds=round(timing.blocked_seconds, 6),
            encode_seconds=round(encoded.seconds, 3),
            seconds=round(time.monotonic() - timing.started, 3),
            regions=regions,
            switch=switch,
            skipped_steps=skipped or [],
            checkpoint=named.identity if named else None,
            checkpoint_begun=begun.identity if begun else None,
            checkpoint_done=checkpoints_done,
        )
        self.metrics.published(result)
        broken = [c for c, r in regions.items() if r.outcome is RegionOutcome.CHAIN_BROKEN]
        if broken and not settings.fallback_full:
            self._chooser.chain_broken = True  # the next publish is the Full
        if broken and kind is SnapshotKind.INCREMENTAL and settings.fallback_full:
            log.warning(
                "a region broke the chain: publishing a Full of the same weights",
                extra={"snapshot": identity, "regions": broken},
            )
            fallback = await self._publish(
                step,
                CapturedWeights(directory=encoded.weights),
                full=True,
                timing=RoundTiming(started=time.monotonic()),
                why="chain-broken",
            )
            result = result.model_copy(update={"fallback": fallback})
        else:
            self._observer.publish_done(result)
        return result

    # --- checkpoints beside the chain -------------------------------------------------------

    def _begin_checkpoint(self, of: str, step: int, weights: Path) -> CheckpointRecord:
        """Record the checkpoint of ``of`` as on its way (saved with the state, so that its
        weights stay pinned and a restarted publisher resumes it)."""
        record = CheckpointRecord(
            identity=checkpoint_identity_for(self.settings.prefix, step),
            of=of,
            step=step,
            weights=str(weights),
        )
        self._state.checkpoint_pending = record
        return record

    def _settle_checkpoints(self) -> list[CheckpointResult]:
        """Take the lane's finished attempt into the state (a complete checkpoint becomes
        the one later deltas name, if its chain still goes on), and start the pending one
        again if nothing is running (a failed attempt, or a publisher restarted)."""
        lane = self._lane
        if lane is None:
            return []
        done: list[CheckpointResult] = []
        outcome = lane.take_outcome()
        if outcome is not None:
            done.append(_checkpoint_result(outcome))
            self._take_outcome(outcome)
        pending = self._state.checkpoint_pending
        if pending is not None and not lane.busy:
            if pending.of in self._state.chain:
                lane.start(pending)
            else:  # the chain restarted from a Full meanwhile: no delta would name it
                self._state.checkpoint_pending = None
                tidy(self._workdir, self._state)
        return done

    def _take_outcome(self, outcome: LaneOutcome) -> None:
        record = outcome.record
        if not outcome.complete:
            return
        if self._state.checkpoint_pending == record:
            self._state.checkpoint_pending = None
        if record.of in self._state.chain:
            self._state.checkpoint = record
        else:
            log.info(
                "a checkpoint completed after its chain ended: no delta names it",
                extra={"checkpoint": record.identity, "of": record.of},
            )
        tidy(self._workdir, self._state)


def _checkpoint_result(outcome: LaneOutcome) -> CheckpointResult:
    record = outcome.record
    return CheckpointResult(
        identity=record.identity,
        of=record.of,
        step=record.step,
        complete=outcome.complete,
        error=outcome.error,
        stored_bytes=outcome.stored_bytes,
        seconds=round(outcome.seconds, 3),
    )
