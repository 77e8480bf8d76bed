"""Build a target snapshot into a free staging buffer: plan, fetch, verify, rebuild.

The engine is never touched here, and neither is a buffer it may read: the agent hands
this loader the free buffer and the planner's :class:`~hotload.sidecar.planning.BuildChoice`.
Each phase reports itself (for ``/status``) and is timed (for the history and
``hotload_phase_seconds``):

- plan: walk manifests back from the target with the chain planner, once for each
  possible base (the free buffer's content, the served buffer's, nothing);
- fetch: every stored file of every snapshot on the plan, in parallel ranged reads that
  resume where a killed sidecar left them (partial files live under ``partial/``);
- verify: the sha256 (or the declared family) of every stored file;
- rebuild: decode each delta onto the snapshot before it, checking every rebuilt tensor's
  hash; the first step reads the base (patching the free buffer's own content in place,
  or writing afresh from the served buffer, which is only read), later steps patch in
  place inside the free buffer.

Every blocking step runs in a thread through :func:`hotload.cancellation.run_cancellable`
with the job's token: a preempted build stops at its next part or tensor and returns only
when no thread touches staging any more.

Errors pass through typed: ``NotFound``/``StorageUnavailable`` (transient),
``ChecksumMismatch``/``ChainBroken``/``ManifestInvalid``/``DecodeFailed`` (chain-breaking,
until a fresh replay says otherwise), ``AccessDenied``. A volume without room or a failed
allocation in any phase is ``DiskFull`` / ``OutOfMemory`` (transient: retried once there
is room), never an untyped error, and leaves no partial file: a download removes its own,
a fresh rebuild its temporary directory, an in-place one restores the buffer exactly.
``TargetInconsistent`` when the deployment's target disagrees with the snapshot's manifest
(the target's fault: never a chain break; the replica waits for the operator's repair).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hotload.api import LoadPath, SnapshotRef
from hotload.api.kinds import Identity
from hotload.cancellation import CancelToken, run_cancellable
from hotload.errors import (
    ChecksumMismatch,
    HotloadError,
    ManifestInvalid,
    ObjectTooLarge,
    TargetInconsistent,
    resource_exhausted,
)
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import Base, BuildChoice, BuildOptions, Slot, Staged
from hotload.sidecar.staging import StagingArea, write_whole
from hotload.sidecar.status import Phase
from hotload.snapshot import (
    MANIFEST_NAME,
    Manifest,
    StoredFile,
    UpdatePlan,
    next_manifest_needed,
    parse_manifest,
    plan_update,
    rebuild,
)
from hotload.snapshot.digest import check_file
from hotload.snapshot.limits import MAX_MANIFEST_BYTES
from hotload.storage import Storage

log = logging.getLogger(__name__)

#: Files downloaded at once (each with its own parallel ranged reads).
FILES_AT_ONCE = 4
#: A snapshot whose rebuilt shards are smaller than this decodes in the loader's own thread:
#: at ~1 GB/s per core that is a few milliseconds, less than starting and joining a decode
#: pool's threads (at 1,000 agents of a tiny model in one shared host, the pool's start and
#: shutdown were ~6 % of the host's CPU, the decoding itself ~1.5 %).
PARALLEL_DECODE_MIN_BYTES = 8 * 1024 * 1024


def decode_threads_for(manifest: Manifest, threads: int) -> int:
    """The decode threads worth starting for ``manifest``: ``threads``, or 1 when its
    shards are too small to gain from more (:data:`PARALLEL_DECODE_MIN_BYTES`)."""
    output = sum(shard.size for shard in manifest.shards)
    return threads if output >= PARALLEL_DECODE_MIN_BYTES else 1


def _first_error(group: ExceptionGroup[Exception]) -> Exception:
    """The one error to report for parallel downloads that failed: a typed one that breaks
    the chain first, then any typed one, then whatever came first."""
    leaves: list[Exception] = []

    def collect(error: Exception) -> None:
        if isinstance(error, ExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        else:
            leaves.append(error)

    collect(group)
    typed = [e for e in leaves if isinstance(e, HotloadError)]
    lasting = [e for e in typed if not e.transient]
    return (lasting or typed or leaves)[0]


@dataclass
class LoadTimings:
    """Seconds per phase of one load, and its bytes."""

    seconds: dict[str, float] = field(default_factory=dict)
    fetched_bytes: int = 0
    stored_bytes: int = 0

    @contextmanager
    def phase(self, name: str, metrics: AgentMetrics) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            metrics.phase_seconds.labels(phase=name).observe(elapsed)


@dataclass(frozen=True)
class Built:
    """A verified rebuild in a buffer, ready to be handed to the engine."""

    target: SnapshotRef
    via: LoadPath
    slot: Slot
    staged: Staged
    manifest: Manifest


def snapshot_at_fault(error: HotloadError, default: str) -> str:
    """Which snapshot's files an error is about (its context names it), else ``default``."""
    for name in ("snapshot", "identity", "missing"):
        value = error.context.get(name)
        if isinstance(value, str) and value:
            return value
    key = error.context.get("key")
    if isinstance(key, str) and "/" in key:
        return key.split("/", 1)[0]
    return default


def exhausted(error: BaseException, staging: StagingArea, phase: str) -> HotloadError | None:
    """``DiskFull``/``OutOfMemory`` for an error that means the pod ran out of room,
    saying how much staging has left; None for any other error."""
    free = staging.free_bytes()
    return resource_exhausted(error, phase=phase, volume=str(staging.root), free_bytes=free)


class BuildFailed(Exception):
    """A build failed: the error, and which snapshot's files were at fault."""

    def __init__(self, error: BaseException, snapshot: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.snapshot = snapshot


class SnapshotLoader:
    """Builds snapshots from one bucket into one staging area's buffers."""

    def __init__(
        self,
        storage: Storage,
        staging: StagingArea,
        metrics: AgentMetrics,
        *,
        concurrency: int,
        part_size: int,
        decode_threads: int,
        on_phase: Callable[[Phase], None],
        on_bytes: Callable[[int, int], None],
    ) -> None:
        self.storage = storage
        self.staging = staging
        self.metrics = metrics
        self.concurrency = concurrency
        self.part_size = part_size
        self.decode_threads = decode_threads
        self._on_phase = on_phase
        self._on_bytes = on_bytes
        self._manifests: dict[str, tuple[Manifest, bytes]] = {}
        self.manifest_bytes = 0
        """Bytes of manifests read from the bucket (they count as bytes moved)."""

    # --- manifests and plans --------------------------------------------------------------

    async def manifest(self, identity: Identity) -> Manifest:
        """The manifest of ``identity`` (cached: snapshots are immutable)."""
        cached = self._manifests.get(identity)
        if cached is not None:
            return cached[0]
        key = f"{identity}/{MANIFEST_NAME}"
        try:
            data = await self.storage.get(key, max_bytes=MAX_MANIFEST_BYTES)
        except ObjectTooLarge as err:
            raise ManifestInvalid(
                "the manifest is over the format's size limit",
                identity=identity,
                limit=MAX_MANIFEST_BYTES,
            ) from err
        self.manifest_bytes += len(data)
        self.metrics.fetched_bytes.inc(len(data))
        manifest = await asyncio.to_thread(parse_manifest, data, expected_identity=identity)
        self._manifests[identity] = (manifest, data)
        return manifest

    def forget_manifests(self, identities: set[Identity]) -> None:
        """Read these manifests from the bucket again next time (a fresh replay)."""
        for identity in identities:
            self._manifests.pop(identity, None)

    async def plan(self, held: str | None, target: SnapshotRef) -> UpdatePlan:
        """The cheapest way from ``held`` (a verified rebuild) to ``target``."""
        known: dict[str, Manifest] = {}
        while (needed := next_manifest_needed(held, target.identity, known)) is not None:
            known[needed] = await self.manifest(needed)
        plan = plan_update(held, target.identity, known)
        target_manifest = known.get(target.identity) or await self.manifest(target.identity)
        if target_manifest.step != target.step or target_manifest.kind != target.kind:
            raise TargetInconsistent(
                "the deployment's target disagrees with the snapshot's manifest: waiting "
                "for the operator to repair the target",
                identity=target.identity,
                target_step=target.step,
                manifest_step=target_manifest.step,
                target_kind=target.kind.value,
                manifest_kind=target_manifest.kind.value,
            )
        return plan

    async def options(
        self, target: SnapshotRef, free: Staged | None, served: Staged | None
    ) -> BuildOptions:
        """The plan from each possible base, for the planner to choose from."""
        self._on_phase(Phase.PLANNING)
        from_nothing = await self.plan(None, target)
        in_place = await self.plan(free.identity, target) if free is not None else None
        from_served = await self.plan(served.identity, target) if served is not None else None
        return BuildOptions(in_place, from_served, from_nothing)

    # --- building -------------------------------------------------------------------------

    async def build(
        self,
        target: SnapshotRef,
        choice: BuildChoice,
        into: Slot,
        served: tuple[Slot, Staged] | None,
        timings: LoadTimings,
        token: CancelToken,
    ) -> Built:
        """Fetch, verify and rebuild ``choice`` into the free buffer ``into``.

        Raises :class:`BuildFailed` carrying the error and the snapshot at fault."""
        plan = choice.plan
        manifests = [await self.manifest(identity) for identity in plan.apply]
        current = target.identity
        await self.fetch_verified(manifests, timings, token)
        try:
            self._on_phase(Phase.REBUILDING)
            with timings.phase("rebuild", self.metrics):
                base = self._base_dir(choice, into, served)
                for manifest in manifests:
                    current = manifest.identity
                    base = await self._rebuild_one(manifest, base, into, token)
        except HotloadError as err:
            raise BuildFailed(err, snapshot_at_fault(err, current)) from err
        except (OSError, MemoryError) as err:
            mapped = exhausted(err, self.staging, "rebuild")
            if mapped is None:
                raise
            raise BuildFailed(mapped, current) from err
        final = manifests[-1]
        staged = self.staging.held(into)
        if staged is None or staged.identity != final.identity:
            raise BuildFailed(
                ChecksumMismatch("the rebuilt buffer has no record", snapshot=final.identity),
                final.identity,
            )
        return Built(target, plan.via, into, staged, final)

    async def fetch_verified(
        self, manifests: list[Manifest], timings: LoadTimings, token: CancelToken
    ) -> None:
        """Fetch every stored file of ``manifests`` (the manifest written beside them) and
        check each one's size and hash: what a rebuild reads, or what an engine that
        patches in place is handed (``fetch/<identity>/``).

        Raises :class:`BuildFailed` carrying the error and the snapshot at fault."""
        current = manifests[-1].identity if manifests else ""
        try:
            with timings.phase("fetch", self.metrics):
                timings.stored_bytes = sum(
                    m.stored_bytes() + len(self._manifests[m.identity][1]) for m in manifests
                )
                self._on_phase(Phase.FETCHING)
                for manifest in manifests:
                    await run_cancellable(token, self._keep_manifest, manifest.identity)
                await self._fetch(manifests, timings, token)
            self._on_phase(Phase.VERIFYING)
            with timings.phase("verify", self.metrics):
                for manifest in manifests:
                    current = manifest.identity
                    await run_cancellable(token, self._verify_stored, manifest, token)
        except HotloadError as err:
            raise BuildFailed(err, snapshot_at_fault(err, current)) from err
        except (OSError, MemoryError) as err:
            mapped = exhausted(err, self.staging, "fetch")
            if mapped is None:
                raise
            raise BuildFailed(mapped, snapshot_at_fault(mapped, current)) from err

    def _base_dir(
        self, choice: BuildChoice, into: Slot, served: tuple[Slot, Staged] | None
    ) -> Path | None:
        """The directory the first delta is decoded onto, and the free buffer emptied of
        everything else (it is ours: neither served nor handed)."""
        if choice.base is Base.IN_PLACE:
            held = self.staging.held(into)
            keep = held.identity if held is not None else None
            self.staging.clear_slot(into, keep=keep)
            return self.staging.snapshot_dir(into, keep) if keep is not None else None
        self.staging.clear_slot(into)
        if choice.base is Base.FROM_SERVED and served is not None:
            slot, staged = served
            return self.staging.snapshot_dir(slot, staged.identity)
        return None

    async def _rebuild_one(
        self, manifest: Manifest, base: Path | None, into: Slot, token: CancelToken
    ) -> Path:
        """Decode one snapshot onto ``base``, into the free buffer; its directory."""
        identity = manifest.identity
        out = self.staging.snapshot_dir(into, identity)
        own = base is not None and base.parent == self.staging.slot_dir(into)
        await run_cancellable(
            token,
            rebuild,
            base,
            self.staging.fetch_dir(identity),
            out,
            threads=decode_threads_for(manifest, self.decode_threads),
            # The verify phase has just hashed every stored file.
            stored_verified=True,
            # Inside the free buffer, patch the previous link in place (only changed pages
            # written); a base in the served buffer is only read.
            consume_previous=own,
            check=token.check,
        )
        if own and base is not None and base.exists():
            await run_cancellable(token, self.staging.clear_slot, into, keep=identity)
        log.info(
            "snapshot rebuilt and verified",
            extra={
                "snapshot": identity,
                "step": manifest.step,
                "kind": manifest.kind.value,
                "buffer": into.value,
            },
        )
        return out

    def _keep_manifest(self, identity: Identity) -> None:
        """Write the manifest beside the downloaded files (the decoder reads it there)."""
        _, data = self._manifests[identity]
        directory = self.staging.fetch_dir(identity)
        directory.mkdir(parents=True, exist_ok=True)
        write_whole(directory / MANIFEST_NAME, data)

    async def _fetch(
        self, manifests: list[Manifest], timings: LoadTimings, token: CancelToken
    ) -> None:
        jobs = [(m.identity, entry) for m in manifests for entry in (*m.files, *m.deltas)]
        total = sum(entry.size for _, entry in jobs)
        done_by_file: dict[str, int] = {}
        self._on_bytes(0, total)

        def progress_for(key: str) -> Callable[[int, int], None]:
            def progress(done: int, _size: int) -> None:
                done_by_file[key] = done
                self._on_bytes(sum(done_by_file.values()), total)

            return progress

        limit = asyncio.Semaphore(FILES_AT_ONCE)

        async def one(identity: Identity, entry: StoredFile) -> None:
            key = f"{identity}/{entry.path}"
            dest = self.staging.fetch_dir(identity) / entry.path
            if dest.is_file() and dest.stat().st_size == entry.size:
                progress_for(key)(entry.size, entry.size)
                return
            async with limit:
                token.check()
                result = await self.storage.download(
                    key,
                    dest,
                    expected_size=entry.size,
                    concurrency=self.concurrency,
                    part_size=self.part_size,
                    progress=progress_for(key),
                    partial=self.staging.partial_dir(identity) / entry.path,
                )
            timings.fetched_bytes += result.fetched_bytes
            self.metrics.fetched_bytes.inc(result.fetched_bytes)

        try:
            async with asyncio.TaskGroup() as group:
                for identity, entry in jobs:
                    group.create_task(one(identity, entry))
        except ExceptionGroup as group_error:
            raise _first_error(group_error) from group_error

    def _verify_stored(self, manifest: Manifest, token: CancelToken) -> None:
        """Every stored file's size and hash; a bad file is removed so a retry refetches it."""
        for entry in (*manifest.files, *manifest.deltas):
            token.check()
            path = self.staging.fetch_dir(manifest.identity) / entry.path
            try:
                check_file(path, entry, manifest.file_hash, snapshot=manifest.identity)
            except ChecksumMismatch:
                path.unlink(missing_ok=True)
                raise
