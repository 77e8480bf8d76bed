"""What every part of the sidecar agent shares: its memory between jobs, the job in
flight, and the small building blocks (the engine and loader it owns, the status it
shows, what the engine serves as far as the pod may say).

:class:`AgentCore` declares the state :class:`~hotload.sidecar.agent.SidecarAgent` sets
up in ``__init__``; the agent's parts — observing the engine
(:mod:`hotload.sidecar.engine_watch`), running load jobs
(:mod:`hotload.sidecar.load_jobs`), and the loop that decides and reports
(:mod:`hotload.sidecar.agent`) — are mixins over it, so each lives in a module of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from hotload.api import LoadPath, ReplicaState, RolloutDeployment, SnapshotRef
from hotload.cancellation import CancelToken
from hotload.engines.protocol import Engine
from hotload.errors import NotFound
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.loader import LoadTimings, SnapshotLoader
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import Attempts, Buffers, Hold, Job, Serving, Slot, Staged
from hotload.sidecar.pod_writer import ObservedPod
from hotload.sidecar.staging import StagingArea
from hotload.sidecar.status import AgentStatus, Phase, SwapRecord
from hotload.sidecar.swap_gate import SwapGate
from hotload.storage import Storage, open_storage

if TYPE_CHECKING:
    from hotload.api import EngineSpec

log = logging.getLogger("hotload.sidecar.agent")

#: Builds the engine adapter once the deployment says which engine the pod runs.
EngineFactory = Callable[["EngineSpec"], Engine]


def _storage_settings(deployment: RolloutDeployment) -> tuple[str, str | None, str | None]:
    hot_load = deployment.spec.hot_load
    return hot_load.bucket_url, hot_load.endpoint, hot_load.region


@dataclass
class RunningJob:
    """The one job in flight: what it works on, how far it got, and how to stop it."""

    job: Job
    target: SnapshotRef | None
    token: CancelToken
    task: asyncio.Task[None] | None = None
    engine_lost: bool = False
    """The engine lost its weights while this job built (it is then preempted)."""
    handed: Slot | None = None
    """The buffer this job handed to the engine (its load's outcome is this job's)."""
    already_handed: bool = False
    """That buffer was handed before this job (an earlier load of unknown outcome): a
    refusal of this job's load says nothing about that one."""


@dataclass
class Retry:
    """When the next attempt at ``target`` may start."""

    target: SnapshotRef | None
    at: float


@dataclass
class Memory:
    """What the agent knows between jobs (the planner's inputs)."""

    serving: Serving | None = None
    buffers: Buffers = field(default_factory=lambda: Buffers({Slot.A: None, Slot.B: None}))
    hold: Hold | None = None
    attempts: Attempts = field(default_factory=Attempts)
    attempts_for: SnapshotRef | None = None
    fresh: bool = False
    retry: Retry | None = None
    engine_answers: bool = True
    unusable: set[Slot] = field(default_factory=set)
    """Handed buffers whose files no longer verify: never loaded, kept untouched until
    the engine is known to be done with them."""
    unstaged_checked: set[tuple[str, str | None]] = field(default_factory=set)
    """(identity, instance) the engine named that no bucket manifest confirmed."""
    unconfirmed: str | None = None
    """What the engine names while its check against the manifest is pending (as of the
    last observation): nothing is loaded over it (``StepKind.CONFIRM``)."""
    weights_unknown: bool = False
    """A load failed where a rollback is not trusted: the engine's label proves nothing
    until a load completes (the served buffer is reloaded)."""
    refused: SnapshotRef | None = None
    """A target the engine refused to patch in place (it is loaded as a directory)."""
    catch_up_given_up: SnapshotRef | None = None
    """A served snapshot whose catch-up into staging failed for good."""
    resume_owed: bool = True
    """The engine may be left paused: by a handover whose resume kept failing, or (at
    start) by a sidecar killed between its pause and its resume. Resumed once nothing is
    being loaded and the engine's weights are confirmed (resuming is idempotent)."""


class AgentCore:
    """The agent's shared state (set by ``SidecarAgent.__init__``) and building blocks."""

    config: AgentConfig
    staging: StagingArea
    _metrics: AgentMetrics
    _status: AgentStatus
    _gate: SwapGate
    _memory: Memory
    _deployment: RolloutDeployment | None
    _engine: Engine | None
    _engine_factory: EngineFactory | None
    _job: RunningJob | None
    _engine_epoch: int
    _handing: bool
    _observed_pod: ObservedPod | None
    _storage: Storage | None
    _storage_key: tuple[str, str | None, str | None] | None
    _loader: SnapshotLoader | None
    _background: set[asyncio.Task[None]]
    _rng: random.Random

    def _context(self) -> dict[str, str]:
        return {"pod": self.config.pod_name, "namespace": self.config.namespace}

    def _delay(self, attempt: int) -> float:
        """The backoff delay before retry number ``attempt`` (0-based), with jitter."""
        return self.config.retry.delay(attempt, self._rng)

    def _target(self) -> SnapshotRef | None:
        deployment = self._deployment
        if deployment is None or deployment.status is None:
            return None
        return deployment.status.target_snapshot

    def _require_deployment(self) -> RolloutDeployment:
        deployment = self._deployment
        if deployment is None:
            raise NotFound("the deployment is gone", deployment=self.config.deployment)
        return deployment

    def _ensure_engine(self, deployment: RolloutDeployment) -> Engine:
        if self._engine is None:
            if self._engine_factory is None:
                raise RuntimeError("no engine and no engine factory")
            self._engine = self._engine_factory(deployment.spec.engine)
        return self._engine

    def _ensure_loader(self, deployment: RolloutDeployment) -> SnapshotLoader:
        settings = _storage_settings(deployment)
        if self._loader is None or self._storage_key != settings:
            old = self._storage
            url, endpoint, region = settings
            self._storage = open_storage(
                url, endpoint=endpoint, region=region, credentials=self.config.credentials
            )
            self._storage_key = settings
            self._loader = SnapshotLoader(
                self._storage,
                self.staging,
                self._metrics,
                concurrency=self.config.download_concurrency,
                part_size=self.config.download_part_size,
                decode_threads=self.config.decode_threads,
                on_phase=self._set_phase,
                on_bytes=self._set_bytes,
            )
            if old is not None:
                closing = asyncio.get_running_loop().create_task(old.aclose())
                self._background.add(closing)
                closing.add_done_callback(self._background.discard)
        return self._loader

    def _set_phase(self, phase: Phase) -> None:
        self._status.phase = phase

    def _set_bytes(self, done: int, total: int) -> None:
        self._status.bytes_done = done
        self._status.bytes_total = total

    def _job_token(self) -> CancelToken:
        running = self._job
        return running.token if running is not None else CancelToken()

    async def _refresh_buffers(self) -> None:
        """Read both buffers back from staging (a slot marked unusable reads as empty
        while it is still handed)."""
        buffers = await asyncio.to_thread(self.staging.buffers)
        unusable = self._memory.unusable
        unusable &= {buffers.handed} if buffers.handed is not None else set()
        contents = {
            slot: None if slot in unusable else held for slot, held in buffers.contents.items()
        }
        self._memory.buffers = replace(buffers, contents=contents)

    def _set_serving(
        self, staged: Staged, via: LoadPath | None, slot: Slot | None, instance: str | None
    ) -> None:
        self._memory.weights_unknown = False
        self._memory.serving = Serving(
            staged.identity, staged.step, staged.kind, via, slot, instance
        )
        self._metrics.set_served(staged.identity, staged.step, staged.kind.value)

    def _lose_serving(self) -> None:
        """The engine no longer serves what we loaded: the pod says so at once."""
        self._memory.serving = None
        self._metrics.clear_served()
        job = self._job
        if job is not None:
            job.engine_lost = True

    def _record_swap(
        self,
        staged: Staged,
        via: LoadPath,
        timings: LoadTimings,
        started: datetime,
        *,
        in_engine: bool = False,
    ) -> None:
        seconds = {name: round(value, 6) for name, value in timings.seconds.items()}
        seconds["total"] = round((datetime.now(UTC) - started).total_seconds(), 6)
        self._status.history.append(
            SwapRecord(
                identity=staged.identity,
                step=staged.step,
                kind=staged.kind.value,
                via=via,
                outcome=ReplicaState.READY,
                started_at=started,
                finished_at=datetime.now(UTC),
                seconds=seconds,
                fetched_bytes=timings.fetched_bytes,
                stored_bytes=timings.stored_bytes,
                in_engine=in_engine,
            )
        )
        log.info(
            "snapshot swapped in",
            extra={
                **self._context(),
                "snapshot": staged.identity,
                "step": staged.step,
                "via": via.value,
                "in_engine": in_engine,
                "seconds": seconds,
                "fetched_bytes": timings.fetched_bytes,
            },
        )
