"""The trainer's publisher: ``Publisher(...).publish(state_dict_or_directory, step)``.

The training loop calls :meth:`Publisher.publish` and gets control back as soon as its
weights are copied to host memory (``PublishResult.blocked_seconds`` says how long that
took); everything else runs on the publisher's own worker thread, one snapshot at a
time in step order:

1. choose Full or Incremental (:mod:`hotload.publish.cadence`: cadence, on demand, and
   after any region reported ``ChainValid=False``);
2. encode in this process (the codec's own threads), against the previous snapshot's
   weights kept in the work directory;
3. upload with parallel (multipart) writes, the manifest last, to every region's bucket
   (each learnt from that region's RolloutDeployment), or only to the home region's
   bucket when the buckets replicate from it (``home``; each other region's snapshot is
   then applied once replication brought it every file, or after
   ``replication_timeout_s``);
4. apply the PolicySnapshot in every region, each region on its own: one that does not
   answer keeps its snapshots queued (in order, in the work directory's state) and gets
   them with the next publish or :meth:`Publisher.flush`;
5. optionally wait until it is Ready in every region; a region that reports the chain
   broken gets, at once, a Full of the same weights (``PublishResult.fallback``; with
   ``fallback_full=False`` the next publish is that Full instead).

``max_pending`` publishes may queue behind the running one; beyond that ``publish``
blocks (the trainer is faster than the links), and that wait counts as blocked time.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotload.api import KvCachePolicy, PolicySnapshot, SnapshotKind
from hotload.errors import ConfigError, HotloadError, NotFound, PublishConflict, PublishError
from hotload.publish.buckets import BucketOpener, open_region_bucket
from hotload.publish.cadence import DEFAULT_FULL_EVERY, Decision, check_prefix, decide, identity_for
from hotload.publish.observer import NullObserver, Phase, PublishObserver
from hotload.publish.region_client import RegionBucket, RegionClient
from hotload.publish.region_run import Landed, RegionRun, Upload, WaitSettings
from hotload.publish.results import PublishResult, RegionOutcome, RegionResult
from hotload.publish.state import LastSnapshot, PendingSnapshot, WorkDir
from hotload.publish.weights import CapturedWeights, capture, materialize
from hotload.snapshot import FORMAT, MANIFEST_NAME, encode
from hotload.snapshot.publish import (
    DEFAULT_UPLOAD_CONCURRENCY,
    UploadReport,
    snapshot_files,
    upload_snapshot,
)
from hotload.storage import Storage

log = logging.getLogger(__name__)

FLUSH_RETRY_S = 1.0
REPLICATION_POLL_S = 0.2
REPLICATION_POLL_MAX_S = 2.0


@dataclass(frozen=True)
class PublisherSettings:
    """Everything a publisher needs to know once."""

    deployment: str
    """The RolloutDeployment (same name in every region) the snapshots are for."""
    contexts: tuple[str, ...]
    """One kube context per region."""
    workdir: Path
    """The publisher's own directory (state, previous weights, encoded snapshots)."""
    namespace: str = "default"
    kubeconfig: Path | None = None
    """None: in-cluster credentials."""
    identity_prefix: str | None = None
    """Identities are ``<prefix>-step-<n>`` (deltas) and ``…-full``; default: the deployment."""
    full_every: int = DEFAULT_FULL_EVERY
    home: str | None = None
    """With bucket replication: the one context whose bucket is written."""
    wait: bool = False
    wait_timeout_s: float = 600.0
    replication_timeout_s: float = 60.0
    """With ``home``: how long a region's PolicySnapshot waits for replication to bring
    the region its copy (checked through the region's publish endpoint) before it is
    applied anyway (its replicas then retry until the files arrive)."""
    replication_nudge_after_s: float = 15.0
    """With ``home``: files still missing in a region's bucket after this long are written
    into the home bucket again (from the encoded snapshot), so replication sends them anew.
    MinIO parks an object whose replication failed (a target it saw offline for a moment)
    for one to several minutes; a new version replicates at once. 0: never."""
    fallback_full: bool = True
    """With ``wait``: when a region reports the chain broken, publish a Full of the same
    weights at once. Off: the next publish is a Full (the cadence's ``chain-broken`` rule)."""
    unreachable_after_s: float = 15.0
    encode_threads: int = 4
    upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY
    max_pending: int = 1
    files_from: Path | None = None
    """Non-tensor files (config.json, tokenizer) that go with a state_dict."""
    dtype: str | None = None
    """Convert a state_dict's tensors to this dtype (e.g. ``bfloat16``) when copying them."""
    kv_cache_policy: KvCachePolicy | None = None
    ignored_config_fields: tuple[str, ...] = ()
    endpoints: Mapping[str, str] = field(default_factory=dict)
    """Context → the endpoint the publisher writes that region's bucket at (overrides
    the RolloutDeployment's)."""

    def __post_init__(self) -> None:
        if not self.contexts:
            raise ConfigError("give at least one kube context (one per region)")
        if len(set(self.contexts)) != len(self.contexts):
            raise ConfigError("kube contexts must be unique", contexts=list(self.contexts))
        if self.home is not None and self.home not in self.contexts:
            raise ConfigError(
                "the home context must be one of the contexts",
                home=self.home,
                contexts=list(self.contexts),
            )
        unknown = sorted(set(self.endpoints) - set(self.contexts))
        if unknown:
            raise ConfigError("endpoints given for unknown contexts", contexts=unknown)
        if self.max_pending < 1 or self.encode_threads < 1 or self.upload_concurrency < 1:
            raise ConfigError("max_pending, encode_threads and upload_concurrency are >= 1")
        if self.wait_timeout_s <= 0:
            raise ConfigError("the wait timeout must be positive", timeout=self.wait_timeout_s)
        check_prefix(self.prefix)

    @property
    def prefix(self) -> str:
        return self.identity_prefix or self.deployment


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


@dataclass
class _PublishJob:
    step: int
    weights: CapturedWeights
    full: bool
    started: float
    future: Future[PublishResult] = field(default_factory=Future)
    blocked_seconds: float = 0.0
    why: str | None = None
    """Set for the automatic fallback Full."""


@dataclass
class _FlushJob:
    deadline: float
    future: Future[dict[str, list[str]]] = field(default_factory=Future)


class Publisher:
    """Publishes snapshots of one deployment to every region (see the module docstring)."""

    def __init__(
        self,
        settings: PublisherSettings,
        *,
        observer: PublishObserver | None = None,
        open_bucket: BucketOpener = open_region_bucket,
    ) -> None:
        self.settings = settings
        self._observer = observer or NullObserver()
        self._open_bucket = open_bucket
        self._workdir = WorkDir(settings.workdir)
        self._workdir.lock()
        try:
            self._state = self._workdir.load(settings.deployment, settings.namespace)
        except BaseException:
            self._workdir.unlock()
            raise
        self._clients = {
            context: RegionClient(
                context, settings.kubeconfig, settings.namespace, settings.deployment
            )
            for context in settings.contexts
        }
        self._buckets: dict[str, RegionBucket] = {}
        self._storages: dict[tuple[str, str | None], Storage] = {}
        self._full_requested = threading.Event()
        self._chain_broken = False
        self._queue: queue.Queue[_PublishJob | _FlushJob | None] = queue.Queue(
            maxsize=settings.max_pending
        )
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="hotload-publisher", daemon=True)
        self._thread.start()

    # --- the training loop's side ---------------------------------------------------

    def publish(
        self, weights: Mapping[str, Any] | Path, step: int, *, full: bool = False
    ) -> PublishHandle:
        """Publish the weights of ``step`` (a state_dict, or a safetensors directory).

        Returns once the weights are copied (and the queue had room); the handle's
        ``result()`` waits for the outcome in every region.
        """
        if self._closed:
            raise PublishError("the publisher is closed")
        started = time.monotonic()
        job = _PublishJob(step, capture(weights, self.settings.dtype), full, started)
        job.blocked_seconds = time.monotonic() - started
        self._queue.put(job)
        blocked = time.monotonic() - started
        job.blocked_seconds = blocked
        return PublishHandle(job.future, step, blocked)

    def request_full(self) -> None:
        """Make the next snapshot a Full."""
        self._full_requested.set()

    def flush(self, timeout_s: float = 60.0) -> dict[str, list[str]]:
        """Retry the snapshots still queued for regions that did not answer, until none is
        left or ``timeout_s`` passed; returns what is still queued, by context."""
        job = _FlushJob(time.monotonic() + timeout_s)
        self._queue.put(job)
        return job.future.result()

    def pending(self) -> dict[str, list[str]]:
        """Snapshots not applied yet, by context (a snapshot of the worker's state)."""
        return {
            context: [item.identity for item in items]
            for context, items in self._state.pending.items()
            if items
        }

    def close(self) -> None:
        """Finish the queued publishes, then stop the worker and release the work directory."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        for client in self._clients.values():
            client.close()
        self._workdir.unlock()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the worker -------------------------------------------------------------------

    def _work(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while True:
                job = self._queue.get()
                if job is None:
                    break
                if isinstance(job, _FlushJob):
                    self._complete(job.future, loop, self._flush(job.deadline))
                else:
                    self._complete(job.future, loop, self._publish(job))
        finally:
            loop.run_until_complete(self._close_storages())
            loop.close()

    @staticmethod
    def _complete(future: Future[Any], loop: asyncio.AbstractEventLoop, work: Any) -> None:
        if not future.set_running_or_notify_cancel():
            work.close()
            return
        try:
            future.set_result(loop.run_until_complete(work))
        except BaseException as err:  # handed to the caller through the future
            log.error("publish failed", extra={"error": str(err)[:500]})
            future.set_exception(err)

    async def _publish(self, job: _PublishJob) -> PublishResult:
        settings = self.settings
        decision = await self._decide(job)
        identity = identity_for(settings.prefix, job.step, decision.kind)
        previous = self._state.last
        weights = self._workdir.weights(identity)
        await asyncio.to_thread(materialize, job.weights, weights, settings.files_from)
        encoded_dir = self._workdir.encoded(identity)
        if encoded_dir.exists():
            shutil.rmtree(encoded_dir)
        encode_started = time.monotonic()
        encoded = await asyncio.to_thread(
            encode,
            Path(previous.weights) if previous and decision.previous else None,
            weights,
            encoded_dir,
            identity=identity,
            step=job.step,
            previous_identity=decision.previous,
            ignored_config_fields=settings.ignored_config_fields,
            threads=settings.encode_threads,
        )
        encode_seconds = time.monotonic() - encode_started
        kind = encoded.manifest.kind
        self._observer.snapshot_encoded(
            identity, kind, job.step, encoded.stored_bytes, encoded.tensor_bytes
        )
        manifest = self._manifest(identity, job.step, kind, decision.previous)
        regions = await self._deliver(identity, manifest, encoded_dir, job.started)
        self._remember(identity, job.step, kind, weights)
        result = PublishResult(
            identity=identity,
            step=job.step,
            kind=kind,
            previous=decision.previous,
            why=job.why or decision.why,
            stored_bytes=encoded.stored_bytes,
            full_bytes=encoded.tensor_bytes,
            blocked_seconds=round(job.blocked_seconds, 6),
            encode_seconds=round(encode_seconds, 3),
            seconds=round(time.monotonic() - job.started, 3),
            regions=regions,
        )
        broken = [c for c, r in regions.items() if r.outcome is RegionOutcome.CHAIN_BROKEN]
        if broken and not self.settings.fallback_full:
            self._chain_broken = True  # the next publish is the Full
        if broken and kind is SnapshotKind.INCREMENTAL and self.settings.fallback_full:
            log.warning(
                "a region broke the chain: publishing a Full of the same weights",
                extra={"snapshot": identity, "regions": broken},
            )
            fallback = _PublishJob(
                job.step,
                CapturedWeights(directory=weights),
                full=True,
                started=time.monotonic(),
                why="chain-broken",
            )
            result = result.model_copy(update={"fallback": await self._publish(fallback)})
        else:
            self._observer.publish_done(result)
        return result

    async def _decide(self, job: _PublishJob) -> Decision:
        last = self._state.last
        requested = job.full or self._full_requested.is_set()
        self._full_requested.clear()
        broken = self._chain_broken
        if last is not None and not requested and not broken and not job.weights.is_lora:
            broken = await self._region_broke_chain()
        return decide(
            step=job.step,
            previous=last.previous() if last else None,
            full_every=self.settings.full_every,
            requested_full=requested,
            chain_broken=broken,
            lora=job.weights.is_lora,
        )

    async def _region_broke_chain(self) -> bool:
        """Whether any region answering now marked a snapshot of the current chain broken."""
        chain = set(self._state.chain)

        async def ask(client: RegionClient) -> list[str]:
            try:
                return await asyncio.to_thread(client.broken, chain)
            except HotloadError:
                return []  # a region that does not answer reports nothing

        answers = await asyncio.gather(*(ask(client) for client in self._clients.values()))
        broken = sorted({name for names in answers for name in names})
        if broken:
            log.warning("a region reports a broken chain", extra={"snapshots": broken})
        return bool(broken)

    def _manifest(
        self, identity: str, step: int, kind: SnapshotKind, previous: str | None
    ) -> dict[str, object]:
        spec: dict[str, object] = {
            "deploymentRef": {"name": self.settings.deployment},
            "identity": identity,
            "step": step,
            "kind": kind.value,
        }
        if previous is not None:
            # the format the encoder just wrote, not the API's historical default (v1)
            spec["incremental"] = {"previousIdentity": previous, "compressionFormat": FORMAT}
        if self.settings.kv_cache_policy is not None:
            spec["kvCachePolicy"] = self.settings.kv_cache_policy.value
        if self.settings.ignored_config_fields:
            spec["ignoredConfigFields"] = list(self.settings.ignored_config_fields)
        snapshot = PolicySnapshot.model_validate(
            {"metadata": {"name": identity, "namespace": self.settings.namespace}, "spec": spec}
        )
        return snapshot.to_k8s()

    async def _deliver(
        self, identity: str, manifest: dict[str, object], encoded: Path, started: float
    ) -> dict[str, RegionResult]:
        await self._resolve_buckets()
        uploads: dict[tuple[tuple[str, str | None], str], asyncio.Task[UploadReport]] = {}
        runs = [self._region_run(context, uploads, started) for context in self.settings.contexts]
        results = await asyncio.gather(
            *(
                run.run(PendingSnapshot(identity=identity, manifest=manifest, encoded=str(encoded)))
                for run in runs
            )
        )
        return {result.context: result for result in results}

    def _region_run(
        self,
        context: str,
        uploads: dict[tuple[tuple[str, str | None], str], asyncio.Task[UploadReport]],
        started: float,
    ) -> RegionRun:
        settings = self.settings
        return RegionRun(
            client=self._clients[context],
            bucket=self._buckets.get(context),
            pending=self._state.pending.setdefault(context, []),
            upload=self._uploader(context, uploads),
            observer=self._observer,
            started=started,
            wait=WaitSettings(settings.wait, settings.wait_timeout_s, settings.unreachable_after_s),
            landed=self._lander(context),
        )

    async def _resolve_buckets(self) -> None:
        """Learn each region's bucket from its RolloutDeployment (once it answers)."""

        async def resolve(context: str) -> None:
            override = self.settings.endpoints.get(context)
            try:
                bucket = await asyncio.to_thread(self._clients[context].bucket, override)
            except HotloadError as err:
                log.warning(
                    "cannot read the region's RolloutDeployment",
                    extra={"context": context, "error": str(err)[:300]},
                )
                return
            self._buckets[context] = bucket

        missing = [c for c in self.settings.contexts if c not in self._buckets]
        await asyncio.gather(*(resolve(context) for context in missing))

    def _write_bucket(self, context: str) -> RegionBucket:
        """The bucket a region's snapshots are written to: its own, or the home one."""
        source = self.settings.home or context
        bucket = self._buckets.get(source)
        if bucket is None:
            raise PublishError(
                "the bucket to write is unknown: its region's RolloutDeployment was not read",
                context=source,
            )
        return bucket

    def _lander(self, context: str) -> Landed | None:
        """Where buckets replicate from the home bucket: a wait until the region's copy
        is complete, so its replicas never look for files that are still on their way."""
        if self.settings.home is None or context == self.settings.home:
            return None

        async def landed(item: PendingSnapshot) -> bool:
            bucket = self._buckets.get(context)
            if bucket is None or self._write_bucket(context).key == bucket.key:
                return True
            storage = self._storage(bucket)
            missing = {f"{item.identity}/{rel}" for rel in snapshot_files(Path(item.encoded))}
            started = time.monotonic()
            deadline = started + self.settings.replication_timeout_s
            nudge_after = self.settings.replication_nudge_after_s
            nudge_at = started + nudge_after if nudge_after > 0 else None
            interval = REPLICATION_POLL_S
            while True:
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
                        return False
                    missing.discard(key)
                if not missing:
                    return True
                if time.monotonic() > deadline:
                    log.warning(
                        "replication has not brought the region its copy yet; applying",
                        extra={"context": context, "snapshot": item.identity},
                    )
                    return False
                if nudge_at is not None and time.monotonic() >= nudge_at:
                    await self._nudge_replication(context, item, sorted(missing))
                    nudge_at = time.monotonic() + 2 * nudge_after
                await asyncio.sleep(interval)
                interval = min(REPLICATION_POLL_MAX_S, interval * 1.5)

        return landed

    async def _nudge_replication(
        self, context: str, item: PendingSnapshot, missing: list[str]
    ) -> None:
        """Write the files a region still lacks into the home bucket again: a new version
        of each, which replication sends at once (the failed one waits in MinIO's retry
        queue). The bytes cross the home link again, and each other region's link once
        more: only in this rare case, and only for the missing files."""
        log.warning(
            "replication is late; writing the missing files into the home bucket again",
            extra={"context": context, "snapshot": item.identity, "files": len(missing)},
        )
        storage = self._storage(self._write_bucket(context))
        encoded = Path(item.encoded)
        for key in missing:
            relative = key.removeprefix(f"{item.identity}/")
            try:
                await storage.put_file(key, encoded / relative)
            except (HotloadError, OSError) as err:
                log.info(
                    "could not write a late file again; waiting for replication",
                    extra={"context": context, "key": key, "error": str(err)[:200]},
                )
                return

    def _storage(self, bucket: RegionBucket) -> Storage:
        storage = self._storages.get(bucket.key)
        if storage is None:
            storage = self._storages[bucket.key] = self._open_bucket(bucket)
        return storage

    def _uploader(
        self,
        context: str,
        uploads: dict[tuple[tuple[str, str | None], str], asyncio.Task[UploadReport]],
    ) -> Upload:
        async def upload(item: PendingSnapshot, phase: Phase) -> UploadReport | None:
            bucket = self._write_bucket(context)
            key = (bucket.key, item.identity)
            task = uploads.get(key)
            if task is not None:
                await task
                return None
            storage = self._storage(bucket)

            def progress(done: int, total: int) -> None:
                self._observer.region_progress(context, phase, done, total)

            async def put() -> UploadReport:
                if await _already_uploaded(storage, Path(item.encoded), item.identity):
                    return UploadReport(keys=(), bytes=0, seconds=0.0)
                return await upload_snapshot(
                    storage,
                    Path(item.encoded),
                    item.identity,
                    concurrency=self.settings.upload_concurrency,
                    progress=progress,
                )

            task = uploads[key] = asyncio.ensure_future(put())
            return await task

        return upload

    def _remember(self, identity: str, step: int, kind: SnapshotKind, weights: Path) -> None:
        """Record the new snapshot as the base of the next one, drop what nothing needs."""
        last = self._state.last
        complete = kind is not SnapshotKind.INCREMENTAL
        last_full = step if complete or last is None else last.last_full_step
        self._state.last = LastSnapshot(
            identity=identity, step=step, kind=kind, last_full_step=last_full, weights=str(weights)
        )
        self._state.chain = [identity] if complete else [*self._state.chain, identity]
        self._chain_broken = False
        self._tidy()

    def _tidy(self) -> None:
        keep_weights = {self._state.last.weights} if self._state.last else set()
        keep_encoded = self._state.referenced_encoded()
        for parent, keep in (
            (self._workdir.weights("x").parent, keep_weights),
            (self._workdir.encoded("x").parent, keep_encoded),
        ):
            if parent.is_dir():
                for child in parent.iterdir():
                    if str(child) not in keep:
                        shutil.rmtree(child, ignore_errors=True)
        self._workdir.save(self._state)

    async def _flush(self, deadline: float) -> dict[str, list[str]]:
        while True:
            waiting = [c for c, items in self._state.pending.items() if items]
            if not waiting:
                break
            await self._resolve_buckets()
            uploads: dict[tuple[tuple[str, str | None], str], asyncio.Task[UploadReport]] = {}
            runs = [self._region_run(c, uploads, time.monotonic()) for c in waiting]
            await asyncio.gather(*(run.drain() for run in runs))
            self._tidy()
            if time.monotonic() >= deadline:
                break
            if any(self._state.pending.get(c) for c in waiting):
                await asyncio.sleep(FLUSH_RETRY_S)
        return self.pending()

    async def _close_storages(self) -> None:
        for storage in self._storages.values():
            await storage.aclose()
        self._storages.clear()


async def _already_uploaded(storage: Storage, encoded: Path, identity: str) -> bool:
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
