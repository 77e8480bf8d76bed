"""Stage a target snapshot: plan, fetch, verify, rebuild — never touching the engine.

The result is a verified Hugging Face directory under staging; swapping it in is the
agent's job. Each phase reports itself (for ``/status``) and is timed (for the history
and ``hotload_phase_seconds``):

- plan: walk manifests back from the target with the chain planner (one delta or several
  from what the replica holds, the Full itself, or a replay from the last Full);
- fetch: every stored file of every snapshot on the plan, in parallel ranged reads that
  resume where a killed sidecar left them;
- verify: the sha256 (or the declared family) of every stored file, in a thread;
- rebuild: decode each delta onto the snapshot before it into a new directory, checking
  every rebuilt tensor's hash, in a thread; the directory appears by an atomic rename.

Errors pass through typed: ``NotFound``/``StorageUnavailable`` (transient: retried by the
agent), ``ChecksumMismatch``/``ChainBroken``/``ManifestInvalid``/``DecodeFailed`` (the
chain is broken), ``AccessDenied``.
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
from hotload.errors import ChecksumMismatch, HotloadError, ManifestInvalid
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.staging import StagingArea
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
from hotload.storage import Storage

log = logging.getLogger(__name__)

#: Files downloaded at once (each with its own parallel ranged reads).
FILES_AT_ONCE = 4


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
class StagedSnapshot:
    """A verified rebuild, ready to be handed to the engine."""

    ref: SnapshotRef
    via: LoadPath
    host_dir: Path
    engine_path: Path
    manifest: Manifest


class SnapshotLoader:
    """Stages snapshots from one bucket into one staging area."""

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

    async def manifest(self, identity: str) -> Manifest:
        """The manifest of ``identity`` (cached: snapshots are immutable)."""
        cached = self._manifests.get(identity)
        if cached is not None:
            return cached[0]
        data = await self.storage.get(f"{identity}/{MANIFEST_NAME}")
        self.manifest_bytes += len(data)
        self.metrics.fetched_bytes.inc(len(data))
        manifest = await asyncio.to_thread(parse_manifest, data, expected_identity=identity)
        self._manifests[identity] = (manifest, data)
        return manifest

    def _keep_manifest(self, identity: str) -> None:
        """Write the manifest beside the downloaded files (the decoder reads it there)."""
        _, data = self._manifests[identity]
        directory = self.staging.fetch_dir(identity)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / MANIFEST_NAME).write_bytes(data)

    async def plan(self, held: str | None, target: SnapshotRef) -> UpdatePlan:
        """The cheapest way from ``held`` (verified in staging, served) to ``target``."""
        self._on_phase(Phase.PLANNING)
        known: dict[str, Manifest] = {}
        while (needed := next_manifest_needed(held, target.identity, known)) is not None:
            known[needed] = await self.manifest(needed)
        plan = plan_update(held, target.identity, known)
        target_manifest = known.get(target.identity)
        if target_manifest is not None and (
            target_manifest.step != target.step or target_manifest.kind != target.kind
        ):
            raise ManifestInvalid(
                "the manifest disagrees with the deployment's target",
                identity=target.identity,
                target_step=target.step,
                manifest_step=target_manifest.step,
                target_kind=target.kind.value,
                manifest_kind=target_manifest.kind.value,
            )
        return plan

    async def stage(
        self, held: str | None, target: SnapshotRef, timings: LoadTimings
    ) -> StagedSnapshot:
        """Plan, fetch, verify and rebuild ``target``; the verified directory."""
        with timings.phase("fetch", self.metrics):
            manifest_bytes_before = self.manifest_bytes
            plan = await self.plan(held, target)
            manifests = [await self.manifest(identity) for identity in plan.apply]
            todo = [m for m in manifests if not self.staging.has_snapshot(m.identity)]
            timings.fetched_bytes += self.manifest_bytes - manifest_bytes_before
            timings.stored_bytes = sum(
                m.stored_bytes() + len(self._manifests[m.identity][1]) for m in manifests
            )
            self._on_phase(Phase.FETCHING)
            for manifest in todo:
                await asyncio.to_thread(self._keep_manifest, manifest.identity)
            await self._fetch(todo, timings)
        self._on_phase(Phase.VERIFYING)
        with timings.phase("verify", self.metrics):
            for manifest in todo:
                await asyncio.to_thread(self._verify_stored, manifest)
        self._on_phase(Phase.REBUILDING)
        with timings.phase("rebuild", self.metrics):
            await self._rebuild(held, plan, manifests)
        final = manifests[-1]
        return StagedSnapshot(
            ref=target,
            via=plan.via,
            host_dir=self.staging.snapshot_dir(final.identity),
            engine_path=self.staging.engine_path(final.identity),
            manifest=final,
        )

    async def _fetch(self, manifests: list[Manifest], timings: LoadTimings) -> None:
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

        async def one(identity: str, entry: StoredFile) -> None:
            key = f"{identity}/{entry.path}"
            dest = self.staging.fetch_dir(identity) / entry.path
            if dest.is_file() and dest.stat().st_size == entry.size:
                progress_for(key)(entry.size, entry.size)
                return
            async with limit:
                result = await self.storage.download(
                    key,
                    dest,
                    expected_size=entry.size,
                    concurrency=self.concurrency,
                    part_size=self.part_size,
                    progress=progress_for(key),
                )
            timings.fetched_bytes += result.fetched_bytes
            self.metrics.fetched_bytes.inc(result.fetched_bytes)

        try:
            async with asyncio.TaskGroup() as group:
                for identity, entry in jobs:
                    group.create_task(one(identity, entry))
        except ExceptionGroup as group_error:
            raise _first_error(group_error) from group_error

    def _verify_stored(self, manifest: Manifest) -> None:
        """Every stored file's size and hash; a bad file is removed so a retry refetches it."""
        for entry in (*manifest.files, *manifest.deltas):
            path = self.staging.fetch_dir(manifest.identity) / entry.path
            try:
                check_file(path, entry, manifest.file_hash, snapshot=manifest.identity)
            except ChecksumMismatch:
                path.unlink(missing_ok=True)
                raise

    async def _rebuild(self, held: str | None, plan: UpdatePlan, manifests: list[Manifest]) -> None:
        """Decode the plan's snapshots in order, each onto the one before; intermediate
        rebuilds of a chain are dropped as soon as the next one stands on them."""
        previous = held if plan.via is LoadPath.DELTA else None
        for manifest in manifests:
            identity = manifest.identity
            if not self.staging.has_snapshot(identity):
                await asyncio.to_thread(self.staging.discard_snapshot, identity)
                base = self.staging.snapshot_dir(previous) if previous is not None else None
                await asyncio.to_thread(
                    rebuild,
                    base,
                    self.staging.fetch_dir(identity),
                    self.staging.snapshot_dir(identity),
                    threads=self.decode_threads,
                    # The verify phase has just hashed every stored file.
                    stored_verified=True,
                    # Patch the previous rebuild in place instead of copying it: the engine
                    # serves from memory, a failed rebuild gives the previous back exactly,
                    # and should it be gone (a crash mid-way, a refused swap) the agent holds
                    # nothing in staging and replays from the last Full.
                    consume_previous=previous is not None,
                )
                log.info(
                    "snapshot rebuilt and verified",
                    extra={
                        "snapshot": identity,
                        "step": manifest.step,
                        "kind": manifest.kind.value,
                    },
                )
            if previous is not None and previous != held:
                await asyncio.to_thread(self.staging.discard_snapshot, previous)
            previous = identity
