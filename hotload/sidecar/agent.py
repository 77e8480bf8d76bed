"""The weight-swap agent: observe, let the planner decide, execute, report.

One class, built from one frozen :class:`AgentConfig` plus what is passed in (the
Kubernetes API client, a prometheus ``CollectorRegistry``, the engine or a factory that
builds it from the deployment's ``spec.engine``). It runs until cancelled. Everything is
per instance (no module globals, no default registry), so the pod runtime can run many
agents as asyncio tasks in one process.

The agent decides nothing itself: every choice is a pure function of
:mod:`hotload.sidecar.planning`. The loop wakes on a new deployment state, on a finished
job, at a retry's time, and at least every ``engine_check_interval_s``; each time it

1. asks the engine what it serves (:meth:`Engine.report`) and lets
   :func:`~hotload.sidecar.planning.judge_engine` say what that means (a restart drops
   the pod's snapshot at once: ``SnapshotReady=False/NotLoaded``, no ``snapshot``
   annotation, until the served buffer is reloaded);
2. lets :func:`~hotload.sidecar.planning.next_step` pick the one thing to do, and runs it
   as a job (patch a one-delta step into an engine that patches in place, else build
   into the free buffer and hand it over; hand over an already built one; reload; settle
   a load of unknown outcome; catch staging up with what the engine serves after an
   in-place patch), or preempts the job in flight when
   :func:`~hotload.sidecar.planning.should_preempt` says so — cancelling it stops its
   threads at their next chunk and returns only when staging is free again (one owner);
3. publishes the report on its Pod (the writer repairs whatever differs, level-triggered).

A failed job goes through :func:`~hotload.sidecar.planning.after_failure`: retry with
backoff, replay from the Full fetched again, or Failed with a reason of
:mod:`hotload.api.reasons` and the snapshot at fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from hotload.api import (
    KvCachePolicy,
    LoadPath,
    ReplicaState,
    RolloutDeployment,
    SnapshotRef,
    Transition,
)
from hotload.api.pod import ANNOTATION_SINCE, ANNOTATION_SNAPSHOT, ANNOTATION_VIA
from hotload.api.reasons import INTERNAL_ERROR
from hotload.cancellation import Cancelled, CancelToken, run_cancellable, run_in_thread
from hotload.engines.capabilities import PatchesInPlace, patches_in_place
from hotload.engines.protocol import Engine, EngineReport
from hotload.errors import DigestMismatch, HotloadError, NotFound
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher
from hotload.sidecar.handover import Handover, HandoverFailed, PatchRefused
from hotload.sidecar.http_server import serve_front
from hotload.sidecar.loader import BuildFailed, LoadTimings, SnapshotLoader, snapshot_at_fault
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import (
    Action,
    Attempts,
    Buffers,
    Failure,
    FailureDecision,
    Hold,
    Job,
    Route,
    Serving,
    Slot,
    Staged,
    Step,
    StepKind,
    Verdict,
    after_failure,
    choose_build,
    choose_route,
    judge_engine,
    next_step,
    replica_state,
    same_snapshot,
    should_preempt,
)
from hotload.sidecar.pod_report import PodAnnotations, readiness_gate
from hotload.sidecar.pod_writer import ObservedPod, PodWriter
from hotload.sidecar.staging import StagingArea
from hotload.sidecar.status import (
    AgentStatus,
    BuffersReport,
    EngineSeen,
    ErrorRecord,
    Phase,
    StatusReport,
    SwapRecord,
)
from hotload.sidecar.swap_gate import SwapGate
from hotload.snapshot import manifest_digest
from hotload.storage import Storage, open_storage

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

    from hotload.api import EngineSpec

log = logging.getLogger(__name__)

#: Builds the engine adapter once the deployment says which engine the pod runs.
EngineFactory = Callable[["EngineSpec"], Engine]


def _storage_settings(deployment: RolloutDeployment) -> tuple[str, str | None, str | None]:
    hot_load = deployment.spec.hot_load
    return hot_load.bucket_url, hot_load.endpoint, hot_load.region


def _same_target(a: SnapshotRef | None, b: SnapshotRef | None) -> bool:
    return (a is None and b is None) or same_snapshot(a, b)


@dataclass
class _RunningJob:
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
class _Retry:
    """When the next attempt at ``target`` may start."""

    target: SnapshotRef | None
    at: float


@dataclass
class _Memory:
    """What the agent knows between jobs (the planner's inputs)."""

    serving: Serving | None = None
    buffers: Buffers = field(default_factory=lambda: Buffers({Slot.A: None, Slot.B: None}))
    hold: Hold | None = None
    attempts: Attempts = field(default_factory=Attempts)
    attempts_for: SnapshotRef | None = None
    fresh: bool = False
    retry: _Retry | None = None
    engine_answers: bool = True
    unusable: set[Slot] = field(default_factory=set)
    """Handed buffers whose files no longer verify: never loaded, kept untouched until
    the engine is known to be done with them."""
    unstaged_checked: set[tuple[str, str | None]] = field(default_factory=set)
    """(identity, instance) the engine named that no bucket manifest confirmed."""
    weights_unknown: bool = False
    """A load failed where a rollback is not trusted: the engine's label proves nothing
    until a load completes (the served buffer is reloaded)."""
    refused: SnapshotRef | None = None
    """A target the engine refused to patch in place (it is loaded as a directory)."""
    catch_up_given_up: SnapshotRef | None = None
    """A served snapshot whose catch-up into staging failed for good."""


class SidecarAgent:
    """One pod's agent. ``await agent.run()`` until cancelled.

    ``engine`` is either an adapter (the runtime's shared mode passes a ``NoopEngine``)
    or a factory called once with the deployment's ``spec.engine`` (the shell's choice:
    the engine kind and port come from the RolloutDeployment).
    """

    def __init__(
        self,
        config: AgentConfig,
        api: ApiClient,
        registry: CollectorRegistry,
        engine: Engine | EngineFactory,
    ) -> None:
        self.config = config
        self.api = api
        self._registry = registry
        self._metrics = AgentMetrics(registry)
        if isinstance(engine, Engine):
            self._engine: Engine | None = engine
            self._engine_factory: EngineFactory | None = None
        else:
            self._engine = None
            self._engine_factory = engine
        self._status = AgentStatus(history=deque(maxlen=config.history_limit))
        self._gate = SwapGate(
            self._metrics,
            hold_timeout_s=config.hold_timeout_s,
            retry_after_s=config.retry_after_s,
        )
        self.staging = StagingArea(config.staging_dir)
        self.writer = PodWriter(
            api,
            config.namespace,
            config.pod_name,
            config.api_retry,
            check_interval_s=config.pod_check_interval_s,
        )
        self._memory = _Memory()
        self._deployment: RolloutDeployment | None = None
        self._wake = asyncio.Event()
        self._storage: Storage | None = None
        self._storage_key: tuple[str, str | None, str | None] | None = None
        self._loader: SnapshotLoader | None = None
        self._job: _RunningJob | None = None
        self._engine_epoch = 0
        self._handing = False
        self._observed_pod: ObservedPod | None = None
        self._served_name: str | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._rng = random.Random()
        self.ready = asyncio.Event()
        """Set once the agent has observed its pod and (when serving HTTP) listens."""

    # --- what the front and the shells read ------------------------------------------

    @property
    def gate(self) -> SwapGate:
        return self._gate

    @property
    def metrics(self) -> AgentMetrics:
        return self._metrics

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def current_engine(self) -> Engine | None:
        return self._engine

    def served_name(self) -> str | None:
        return self._served_name

    def served_identity(self) -> str | None:
        """What the engine serves, verified, as its last report confirmed (None: nothing
        verified — the front then labels only with what the engine itself says)."""
        serving = self._memory.serving
        return serving.identity if serving else None

    def status_report(self) -> StatusReport:
        deployment = self._deployment
        buffers = self._memory.buffers
        a, b = buffers.held(Slot.A), buffers.held(Slot.B)
        self._status.buffers = BuffersReport(
            a=a.identity if a else None,
            b=b.identity if b else None,
            served=buffers.served.value if buffers.served else None,
            handed=buffers.handed.value if buffers.handed else None,
        )
        return self._status.report(
            pod=self.config.pod_name,
            namespace=self.config.namespace,
            deployment=self.config.deployment,
            engine=self._engine.kind.value if self._engine else None,
            transition=deployment.spec.hot_load.transition.value if deployment else None,
        )

    # --- running -----------------------------------------------------------------------

    async def run(self) -> None:
        """Watch, load and report until cancelled; serve HTTP when ``serve_http``."""
        await asyncio.to_thread(self.staging.prepare)
        await self._refresh_buffers()
        self._observed_pod = await self._observe_pod()
        self._resume_since()
        watcher = DeploymentWatcher(
            self.api,
            self.config.namespace,
            self.config.deployment,
            self.config.api_retry,
            self._on_deployment,
        )
        client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(watcher.run(), name="deployment-watch")
                group.create_task(self.writer.run(), name="pod-writer")
                group.create_task(self._reconcile(), name="reconcile")
                if self.config.serve_http:
                    group.create_task(
                        serve_front(self, client, self.config, self.ready), name="http"
                    )
                else:
                    self.ready.set()
        finally:
            await self._stop_job()
            await client.aclose()
            await self._close()

    async def _close(self) -> None:
        if self._storage is not None:
            with contextlib.suppress(Exception):
                await self._storage.aclose()
        if self._engine is not None and self._engine_factory is not None:
            with contextlib.suppress(Exception):
                await self._engine.aclose()

    async def _observe_pod(self) -> ObservedPod | None:
        """Read our Pod once (a restarted sidecar picks up its report); retried while
        transient, given up (None) when the API refuses for good."""
        attempt = 0
        while True:
            try:
                return await self.writer.observe()
            except HotloadError as err:
                if not err.transient:
                    log.error("cannot read own pod", extra={**self._context(), "error": str(err)})
                    return None
                await asyncio.sleep(self._delay(attempt))
                attempt += 1

    def _resume_since(self) -> None:
        """Keep the Pod's ``since`` across a sidecar restart when the state is unchanged."""
        observed = self._observed_pod
        if observed is None:
            return
        since = observed.annotations.get(ANNOTATION_SINCE)
        if since:
            with contextlib.suppress(ValueError):
                self._status.since = datetime.fromisoformat(since.replace("Z", "+00:00"))

    def _context(self) -> dict[str, str]:
        return {"pod": self.config.pod_name, "namespace": self.config.namespace}

    def _delay(self, attempt: int) -> float:
        """The backoff delay before retry number ``attempt`` (0-based), with jitter."""
        return self.config.retry.delay(attempt, self._rng)

    def _on_deployment(self, view: DeploymentView) -> None:
        """From the watch: remember the newest state and wake the loop."""
        self._deployment = view.deployment
        deployment = view.deployment
        if deployment is not None:
            self._served_name = deployment.spec.model.served_name
            target = deployment.status.target_snapshot if deployment.status else None
            if target is not None:
                self._metrics.target_step.set(target.step)
        self._wake.set()

    def _target(self) -> SnapshotRef | None:
        deployment = self._deployment
        if deployment is None or deployment.status is None:
            return None
        return deployment.status.target_snapshot

    # --- the loop ------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Observe the engine, decide, execute; on every wake and at least every
        ``engine_check_interval_s``."""
        while True:
            await self._sleep()
            self._wake.clear()
            self._status.target = self._target()
            if self._deployment is not None and self._engine is None:
                self._engine_for_probes(self._deployment)
            job = self._job
            if job is not None and job.task is not None and job.task.done():
                self._job = None
            await self._observe_engine()
            await self._decide()
            self._report()

    async def _sleep(self) -> None:
        timeout = self.config.engine_check_interval_s
        retry = self._memory.retry
        if retry is not None:
            timeout = min(timeout, max(0.0, retry.at - asyncio.get_running_loop().time()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    async def _decide(self) -> None:
        memory = self._memory
        target = self._target()
        if not _same_target(memory.attempts_for, target):
            memory.attempts, memory.attempts_for, memory.fresh = Attempts(), target, False
        job = self._job
        if job is not None:
            if should_preempt(job.job, job.target, target, engine_lost=job.engine_lost):
                log.info(
                    "preempting the job in flight",
                    extra={
                        **self._context(),
                        "job": job.job.value,
                        "working_on": job.target.identity if job.target else None,
                        "target": target.identity if target else None,
                        "engine_lost": job.engine_lost,
                    },
                )
                await self._stop_job()
            else:
                return
        if self._deployment is None:
            self._status.phase = Phase.WAITING
            return
        retry = memory.retry
        if retry is not None:
            if _same_target(retry.target, target) and asyncio.get_running_loop().time() < retry.at:
                self._status.phase = Phase.RETRYING
                return
            memory.retry = None
        step = next_step(
            target,
            memory.serving,
            memory.buffers,
            memory.hold,
            engine_answers=memory.engine_answers,
            catch_up_given_up=memory.catch_up_given_up,
        )
        self._execute(step)

    def _execute(self, step: Step) -> None:
        kind = step.kind
        if kind is StepKind.WAIT_ENGINE:
            self._status.phase = Phase.WAITING
        elif kind is StepKind.IDLE:
            self._status.phase = Phase.WAITING if self._memory.serving is None else Phase.IDLE
        elif kind is StepKind.HOLD:
            self._status.phase = Phase.FAILED
        elif kind is StepKind.READY:
            self._status.phase = Phase.IDLE
            self._memory.attempts = Attempts()
        elif kind in (StepKind.SETTLE, StepKind.RELOAD):
            assert step.slot is not None
            self._start(Job.RELOAD, self._target(), self._reload(step.slot, kind))
        elif kind is StepKind.SWAP:
            assert step.slot is not None and step.target is not None
            self._start(Job.BUILD, step.target, self._swap_built(step.slot, step.target))
        elif kind is StepKind.BUILD:
            assert step.slot is not None and step.target is not None
            self._start(Job.BUILD, step.target, self._build_and_swap(step.slot, step.target))
        elif kind is StepKind.CATCH_UP:
            assert step.slot is not None and step.target is not None
            self._start(Job.CATCH_UP, step.target, self._catch_up(step.slot, step.target))

    def _start(self, job: Job, target: SnapshotRef | None, body: Awaitable[None]) -> None:
        running = _RunningJob(job, target, CancelToken())
        self._job = running
        running.task = asyncio.get_running_loop().create_task(
            self._run_job(running, body), name=f"job {job.value}"
        )
        running.task.add_done_callback(lambda _: self._wake.set())

    async def _stop_job(self) -> None:
        """Cancel the job in flight and wait until none of its threads runs."""
        job = self._job
        if job is None or job.task is None:
            return
        job.token.cancel()
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job.task
        self._job = None
        await self._refresh_buffers()

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

    # --- the engine's word ---------------------------------------------------------------

    async def _observe_engine(self) -> None:
        """Ask the engine what it serves and bring what the pod says in line with it."""
        engine = self._engine
        if engine is None or self._handing:
            return
        epoch = self._engine_epoch
        report = await self._engine_report(engine, digest=False)
        memory = self._memory
        if report is not None and report.identity is not None:
            serving = memory.serving
            if serving is None or serving.identity != report.identity:
                report = await self._engine_report(engine, digest=True)
        if self._handing or epoch != self._engine_epoch:
            return  # a handover started or ended meanwhile: this answer is stale
        self._status.engine_seen = EngineSeen(
            identity=report.identity if report else None,
            instance_id=report.instance_id if report else None,
            answered=report is not None,
            at=datetime.now(UTC),
        )
        judgement = judge_engine(
            memory.serving, report, memory.buffers, weights_unknown=memory.weights_unknown
        )
        verdict = judgement.verdict
        memory.engine_answers = verdict is not Verdict.UNREACHABLE
        if verdict is Verdict.LOST:
            log.warning(
                "the engine does not serve what the pod says; reloading",
                extra={**self._context(), "detail": judgement.detail},
            )
            self._lose_serving()
        elif (verdict is Verdict.LANDED and judgement.slot is not None and report is not None) or (
            verdict is Verdict.ADOPT and judgement.slot is not None and report is not None
        ):
            await self._confirm(judgement.slot, report, self._observed_via(judgement.identity))
        elif verdict is Verdict.ADOPT_UNSTAGED and report is not None:
            await self._adopt_unstaged(report)
        elif verdict is Verdict.EMPTY and memory.serving is not None:
            self._lose_serving()

    async def _engine_report(self, engine: Engine, *, digest: bool) -> EngineReport | None:
        try:
            async with asyncio.timeout(self.config.engine_report_timeout_s):
                return await engine.report(digest=digest)
        except (HotloadError, TimeoutError) as err:
            log.info("the engine did not answer", extra={**self._context(), "error": str(err)})
            return None

    def _lose_serving(self) -> None:
        """The engine no longer serves what we loaded: the pod says so at once."""
        self._memory.serving = None
        self._metrics.clear_served()
        job = self._job
        if job is not None:
            job.engine_lost = True

    async def _confirm(self, slot: Slot, report: EngineReport, via: LoadPath | None) -> None:
        """The engine serves the verified rebuild in ``slot``: that buffer is the served one."""
        buffers = self._memory.buffers
        staged = buffers.held(slot)
        if staged is None:
            return
        # A buffer handed with its outcome unknown stays handed (the engine may still be
        # reading it) unless it is the one now confirmed.
        handed = None if buffers.handed == slot else buffers.handed
        await run_in_thread(self.staging.set_roles, slot, handed)
        self._memory.buffers = replace(buffers, served=slot, handed=handed)
        self._set_serving(staged, via, slot, report.instance_id)
        log.info(
            "the engine serves a staged snapshot",
            extra={**self._context(), "snapshot": staged.identity, "buffer": slot.value},
        )

    async def _adopt_unstaged(self, report: EngineReport) -> None:
        """The engine names a snapshot no buffer holds: trust it once its manifest (and
        the digest, where the engine gives one) confirms it."""
        identity = report.identity
        key = (identity or "", report.instance_id)
        deployment = self._deployment
        if identity is None or deployment is None or key in self._memory.unstaged_checked:
            return
        try:
            manifest = await self._ensure_loader(deployment).manifest(identity)
        except HotloadError as err:
            if isinstance(err, NotFound) or not err.transient:
                self._memory.unstaged_checked.add(key)
            log.info(
                "the engine serves a snapshot this replica cannot confirm",
                extra={**self._context(), "snapshot": identity, "error": str(err)},
            )
            return
        if report.digest is not None and report.digest != manifest_digest(manifest):
            self._memory.unstaged_checked.add(key)
            log.warning(
                "the engine's weights are not the snapshot it names",
                extra={**self._context(), "snapshot": identity},
            )
            return
        staged = Staged(identity, manifest.step, manifest.kind, manifest_digest(manifest))
        self._set_serving(staged, self._observed_via(identity), None, report.instance_id)

    def _observed_via(self, identity: str | None) -> LoadPath | None:
        observed = self._observed_pod.annotations if self._observed_pod else {}
        if identity is not None and observed.get(ANNOTATION_SNAPSHOT) == identity:
            with contextlib.suppress(ValueError):
                return LoadPath(observed.get(ANNOTATION_VIA, ""))
        return None

    def _set_serving(
        self, staged: Staged, via: LoadPath | None, slot: Slot | None, instance: str | None
    ) -> None:
        self._memory.weights_unknown = False
        self._memory.serving = Serving(
            staged.identity, staged.step, staged.kind, via, slot, instance
        )
        self._metrics.set_served(staged.identity, staged.step, staged.kind.value)

    # --- jobs ----------------------------------------------------------------------------

    async def _run_job(self, running: _RunningJob, body: Awaitable[None]) -> None:
        """Run one job; a failure goes through the planner's :func:`after_failure`."""
        try:
            await body
        except asyncio.CancelledError:
            log.info("job cancelled", extra={**self._context(), "job": running.job.value})
            raise
        except Cancelled:
            # A thread stopped at its next chunk because the job was preempted: no failure.
            log.info("job stopped at a chunk", extra={**self._context(), "job": running.job.value})
        except (BuildFailed, HandoverFailed, HotloadError, Exception) as err:
            await self._failed(running, err)
        finally:
            self._handing = False
            await self._refresh_buffers()

    async def _build_and_swap(self, into: Slot, target: SnapshotRef) -> None:
        deployment = self._require_deployment()
        loader = self._ensure_loader(deployment)
        manifests_before = loader.manifest_bytes
        memory = self._memory
        self._status.phase = Phase.PLANNING
        token = self._job_token()
        if memory.fresh:
            await self._forget_chain(loader, target)
        served_slot = memory.buffers.served
        served = memory.buffers.held(served_slot)
        free = memory.buffers.held(into)
        try:
            options = await loader.options(target, free, served)
        except HotloadError as err:
            raise BuildFailed(err, snapshot_at_fault(err, target.identity)) from err
        timings = LoadTimings()
        started = datetime.now(UTC)
        engine = self._ensure_engine(deployment)
        applier = patches_in_place(engine)
        if applier is not None and await self._route(loader, target) is Route.IN_ENGINE:
            if await self._apply_in_engine(
                applier, loader, target, timings, started, manifests_before
            ):
                return
            # Refused: the old weights serve on; build and load the directory instead.
            timings = LoadTimings()
        choice = choose_build(options, fresh=memory.fresh)
        base = (served_slot, served) if served_slot is not None and served is not None else None
        built = await loader.build(target, choice, into, base, timings, token)
        # Manifests count as bytes moved when this attempt read them from the bucket.
        timings.fetched_bytes += loader.manifest_bytes - manifests_before
        await self._refresh_buffers()
        await self._hand(into, built.staged, target, built.via, timings, started)

    async def _route(self, loader: SnapshotLoader, target: SnapshotRef) -> Route:
        """The planner's route for ``target``, from the plan out of what the engine serves
        (a plan that cannot be made — a chain the engine's snapshot is not on — is no
        one-delta step: the directory load)."""
        memory = self._memory
        serving = memory.serving
        plan = None
        if serving is not None and not memory.fresh:
            try:
                plan = await loader.plan(serving.identity, target)
            except HotloadError as err:
                log.info(
                    "no plan from the engine's snapshot; loading a directory",
                    extra={**self._context(), "serving": serving.identity, "error": str(err)},
                )
        return choose_route(
            target,
            serving,
            plan,
            patches_in_place=True,
            fresh=memory.fresh,
            refused=memory.refused,
        )

    async def _apply_in_engine(
        self,
        engine: PatchesInPlace,
        loader: SnapshotLoader,
        target: SnapshotRef,
        timings: LoadTimings,
        started: datetime,
        manifests_before: int,
    ) -> bool:
        """Fetch and verify the target's delta and hand it to the engine's in-place patch.
        True once the engine's report confirms the target (identity and digest); False
        when it refused and serves its old weights (recorded: this target then loads
        as a directory)."""
        deployment = self._require_deployment()
        manifest = await loader.manifest(target.identity)
        await loader.fetch_verified([manifest], timings, self._job_token())
        timings.fetched_bytes += loader.manifest_bytes - manifests_before
        staged = Staged(manifest.identity, manifest.step, manifest.kind, manifest_digest(manifest))
        running = self._job
        transition = deployment.spec.hot_load.transition
        if running is not None and running.job is Job.BUILD:
            running.job = Job.DRAIN
            self._status.phase = Phase.DRAINING if transition is Transition.SYNC else Phase.SWAPPING

        def swapping() -> None:
            if running is not None:
                running.job = Job.SWAP
            self._handing = True
            self._engine_epoch += 1
            self._status.phase = Phase.SWAPPING

        handover = Handover(
            self._ensure_engine(deployment),
            self.staging,
            self._gate,
            self._metrics,
            drain_timeout_s=self.config.sync_drain_timeout_s,
        )
        try:
            with timings.phase("swap", self._metrics):
                report = await handover.apply_delta(
                    engine,
                    staged,
                    transition=transition,
                    cache_policy=target.kv_cache_policy,
                    on_swapping=swapping,
                )
        except PatchRefused as refused:
            self._memory.refused = target
            if running is not None:
                running.job = Job.BUILD
            log.info(
                "the engine did not patch the delta in place; loading the rebuilt directory",
                extra={
                    **self._context(),
                    "snapshot": target.identity,
                    "reason": refused.error.reason,
                    "error": str(refused.error),
                },
            )
            return False
        finally:
            self._engine_epoch += 1
            self._handing = False
        memory = self._memory
        self._set_serving(staged, LoadPath.DELTA, None, report.instance_id)
        if memory.hold is not None and same_snapshot(memory.hold.target, target):
            memory.hold = None
        memory.attempts, memory.fresh = Attempts(), False
        self._metrics.swaps.labels(via=LoadPath.DELTA.value).inc()
        self._record_swap(staged, LoadPath.DELTA, timings, started, in_engine=True)
        return True

    async def _catch_up(self, into: Slot, target: SnapshotRef) -> None:
        """Build the snapshot the engine already serves into the free buffer and make that
        the served buffer (no load): a restarted engine then reloads what it served."""
        deployment = self._require_deployment()
        loader = self._ensure_loader(deployment)
        memory = self._memory
        token = self._job_token()
        served_slot = memory.buffers.served
        served = memory.buffers.held(served_slot)
        free = memory.buffers.held(into)
        fresh = memory.fresh
        self._status.phase = Phase.PLANNING
        if fresh:
            await self._forget_chain(loader, target)
        if free is not None and same_snapshot(free, target) and not fresh:
            await run_cancellable(token, self.staging.verify, into, free)
            staged = free
        else:
            try:
                options = await loader.options(target, free, served)
            except HotloadError as err:
                raise BuildFailed(err, snapshot_at_fault(err, target.identity)) from err
            base = (served_slot, served) if served_slot is not None and served else None
            choice = choose_build(options, fresh=fresh)
            built = await loader.build(target, choice, into, base, LoadTimings(), token)
            staged = built.staged
        # The engine's word, as for a swap: the rebuild must be what it serves.
        report = await self._ensure_engine(deployment).report(digest=True)
        serving = memory.serving
        if serving is None or not same_snapshot(serving, staged):
            return  # the engine moved on meanwhile: the next reconcile decides
        if report.identity != staged.identity or (
            report.digest is not None
            and staged.digest is not None
            and report.digest != staged.digest
        ):
            raise DigestMismatch(
                "the engine's weights differ from the snapshot rebuilt for it",
                snapshot=staged.identity,
                expected=staged.digest,
                found=report.digest,
            )
        await self._refresh_buffers()
        await run_in_thread(self.staging.set_roles, into, memory.buffers.handed)
        memory.buffers = replace(memory.buffers, served=into)
        memory.serving = replace(serving, slot=into)
        memory.fresh = False
        if fresh and served_slot not in (None, into):
            # A fresh replay healed a local corruption: the older served buffer was never
            # re-verified, so it is no base for the next build.
            assert served_slot is not None
            await run_in_thread(self.staging.clear_slot, served_slot)
            await self._refresh_buffers()
        await run_in_thread(self.staging.clean_fetches, {staged.identity})
        self._status.phase = Phase.IDLE
        log.info(
            "staging caught up with the served snapshot",
            extra={**self._context(), "snapshot": staged.identity, "buffer": into.value},
        )

    async def _swap_built(self, slot: Slot, target: SnapshotRef) -> None:
        """Hand over a target built earlier (its swap was refused busy): re-hashed first,
        since its files sat in staging meanwhile; a changed file means a fresh build."""
        staged = self._memory.buffers.held(slot)
        if staged is None:
            return
        self._status.phase = Phase.VERIFYING
        try:
            await run_cancellable(self._job_token(), self.staging.verify, slot, staged)
        except HotloadError as err:
            await run_in_thread(self.staging.clear_slot, slot)
            raise BuildFailed(err, staged.identity) from err
        await self._hand(slot, staged, target, None, LoadTimings(), datetime.now(UTC))

    async def _reload(self, slot: Slot, kind: StepKind) -> None:
        """Load a staged buffer again: the served one after the engine lost its weights,
        or the handed one to settle a load of unknown outcome."""
        staged = self._memory.buffers.held(slot)
        if staged is None:
            return
        self._status.phase = Phase.RELOADING
        why = "settle a load of unknown outcome" if kind is StepKind.SETTLE else "engine lost it"
        log.info(
            "reloading a staged snapshot into the engine",
            extra={
                **self._context(),
                "snapshot": staged.identity,
                "buffer": slot.value,
                "why": why,
            },
        )
        try:
            await run_cancellable(self._job_token(), self.staging.verify, slot, staged)
        except HotloadError as err:
            if slot == self._memory.buffers.handed:
                self._memory.unusable.add(slot)  # the engine may still read it: untouched
                log.warning(
                    "a handed buffer no longer verifies; it is not loaded again",
                    extra={**self._context(), "buffer": slot.value, "error": str(err)},
                )
            else:
                await self._abandon(slot, str(err))
            await self._refresh_buffers()
            return
        await self._hand(slot, staged, None, LoadPath.RELOAD, LoadTimings(), datetime.now(UTC))

    async def _abandon(self, slot: Slot, why: str) -> None:
        """A buffer that cannot be loaded any more is no reload source (the next load
        builds from the bucket); a handed one stays untouched until the engine settles."""
        buffers = await asyncio.to_thread(self.staging.buffers)
        served = None if buffers.served == slot else buffers.served
        handed = None if buffers.handed == slot else buffers.handed
        await run_in_thread(self.staging.set_roles, served, handed)
        if slot != buffers.handed:
            await run_in_thread(self.staging.clear_slot, slot)
        log.warning(
            "a staged snapshot is no longer usable",
            extra={**self._context(), "buffer": slot.value, "error": why},
        )

    async def _hand(
        self,
        slot: Slot,
        staged: Staged,
        target: SnapshotRef | None,
        via: LoadPath | None,
        timings: LoadTimings,
        started: datetime,
    ) -> None:
        """Hand ``slot`` to the engine and record what it now serves."""
        deployment = self._require_deployment()
        engine = self._ensure_engine(deployment)
        running = self._job
        transition = deployment.spec.hot_load.transition
        if running is not None and running.job is Job.BUILD:
            running.job = Job.DRAIN
            self._status.phase = Phase.DRAINING if transition is Transition.SYNC else Phase.SWAPPING

        already = self._memory.buffers.handed == slot

        def swapping() -> None:
            if running is not None:
                running.handed, running.already_handed = slot, already
                if running.job is Job.DRAIN:
                    running.job = Job.SWAP
            self._handing = True
            self._engine_epoch += 1
            self._status.phase = Phase.RELOADING if via is LoadPath.RELOAD else Phase.SWAPPING

        await engine.wait_ready(self.config.engine_ready_timeout_s)
        handover = Handover(
            engine,
            self.staging,
            self._gate,
            self._metrics,
            drain_timeout_s=self.config.sync_drain_timeout_s,
        )
        with timings.phase("swap", self._metrics):
            report = await handover.hand(
                slot,
                staged,
                served=self._memory.buffers.served,
                transition=transition,
                cache_policy=target.kv_cache_policy if target is not None else None,
                on_swapping=swapping,
            )
        self._engine_epoch += 1
        self._handing = False
        memory = self._memory
        previous = memory.buffers.served
        memory.buffers = replace(memory.buffers, served=slot, handed=None)
        if memory.fresh and target is not None and previous not in (None, slot):
            # A fresh replay healed a local corruption: the buffer served until now was
            # never re-verified, so it is no base for the next build.
            await run_in_thread(self.staging.clear_slot, previous)
            await self._refresh_buffers()
        final_via = via or LoadPath.DELTA
        self._set_serving(staged, final_via, slot, report.instance_id)
        if (
            target is not None
            and memory.hold is not None
            and same_snapshot(memory.hold.target, target)
        ):
            memory.hold = None
        if target is not None:
            memory.attempts, memory.fresh = Attempts(), False
        self._metrics.swaps.labels(via=final_via.value).inc()
        self._record_swap(staged, final_via, timings, started)
        # The served snapshot's own download stays: the free buffer, one step behind,
        # is patched through it next time.
        await run_in_thread(self.staging.clean_fetches, {staged.identity})

    def _job_token(self) -> CancelToken:
        running = self._job
        return running.token if running is not None else CancelToken()

    async def _forget_chain(self, loader: SnapshotLoader, target: SnapshotRef) -> None:
        """Before a fresh replay: read the chain's manifests and files from the bucket
        again (what staging holds may be what was bad)."""
        loader.forget_manifests({target.identity})
        plan = await loader.plan(None, target)
        chain = set(plan.apply) | {target.identity}
        loader.forget_manifests(chain)
        await run_in_thread(self.staging.drop_fetched, chain)
        log.info(
            "replaying from the last Full, every file fetched again",
            extra={**self._context(), "snapshot": target.identity, "chain": sorted(chain)},
        )

    def _require_deployment(self) -> RolloutDeployment:
        deployment = self._deployment
        if deployment is None:
            raise NotFound("the deployment is gone", deployment=self.config.deployment)
        return deployment

    # --- failures ------------------------------------------------------------------------

    async def _failed(self, running: _RunningJob, err: BaseException) -> None:
        memory = self._memory
        error: BaseException = err
        snapshot = running.target.identity if running.target else None
        outcome_known = True
        if isinstance(err, BuildFailed):
            error, snapshot = err.error, err.snapshot
        elif isinstance(err, HandoverFailed):
            error, outcome_known = err.error, err.outcome_known
        expected = isinstance(error, HotloadError)
        reason = error.reason if isinstance(error, HotloadError) else INTERNAL_ERROR
        message = str(error) if expected else f"{type(error).__name__}: {error}"
        if not expected:
            log.error(
                "job failed unexpectedly",
                exc_info=error,
                extra={**self._context(), "job": running.job.value},
            )
        engine = self._engine
        failure = Failure(
            reason, running.job, expected=expected, fresh=memory.fresh, outcome_known=outcome_known
        )
        decision = after_failure(
            failure,
            memory.attempts,
            rollback_trusted=engine.rollback_trusted if engine is not None else True,
            unexpected_cap=self.config.unexpected_failure_cap,
        )
        self._metrics.failures.labels(reason=decision.reason).inc()
        target = running.target
        self._status.last_error = ErrorRecord(
            reason=decision.reason,
            message=message,
            transient=decision.action is not Action.FAIL,
            target=target.identity if target else None,
            at=datetime.now(UTC),
        )
        log.warning(
            "job failed",
            extra={
                **self._context(),
                "job": running.job.value,
                "reason": decision.reason,
                "action": decision.action.value,
                "error": message,
                "snapshot": snapshot,
            },
        )
        await self._apply_decision(decision, running, message, snapshot)

    async def _apply_decision(
        self,
        decision: FailureDecision,
        running: _RunningJob,
        message: str,
        snapshot: str | None,
    ) -> None:
        memory = self._memory
        if decision.weights_unknown:
            self._lose_serving()
            memory.weights_unknown = True
        buffers = await asyncio.to_thread(self.staging.buffers)
        if decision.abandon_buffer and running.handed is not None:
            await self._abandon(running.handed, message)
        elif (
            running.handed is not None
            and buffers.handed == running.handed
            and not decision.outcome_unknown
            and not running.already_handed
        ):
            # The engine answered this job's load: it did not take it, or no longer holds
            # it; nothing else may still be reading that buffer.
            await run_in_thread(self.staging.set_roles, buffers.served, None)
        await self._refresh_buffers()
        if decision.counted:
            memory.attempts = replace(memory.attempts, unexpected=memory.attempts.unexpected + 1)
        else:
            memory.attempts = replace(memory.attempts, transient=memory.attempts.transient + 1)
        target = running.target
        if decision.action is Action.RETRY:
            delay = self._delay(decision.backoff_attempt)
            memory.retry = _Retry(target, asyncio.get_running_loop().time() + delay)
        elif decision.action is Action.RETRY_FRESH:
            memory.fresh = True
        elif decision.action is Action.GIVE_UP:
            memory.catch_up_given_up = target
            log.warning(
                "staging does not hold the served snapshot; a restarted engine reloads "
                "the older served buffer",
                extra={**self._context(), "snapshot": target.identity if target else None},
            )
        elif target is not None:
            memory.hold = Hold(target, decision.reason, message, snapshot or target.identity)
            now = datetime.now(UTC)
            self._status.history.append(
                SwapRecord(
                    identity=target.identity,
                    step=target.step,
                    kind=target.kind.value,
                    outcome=ReplicaState.FAILED,
                    reason=decision.reason,
                    started_at=now,
                    finished_at=now,
                )
            )

    # --- building blocks -----------------------------------------------------------------

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

    def _engine_for_probes(self, deployment: RolloutDeployment) -> None:
        """Build the engine adapter as soon as the deployment names it, so ``/readyz``
        answers for the engine before any target exists."""
        try:
            self._ensure_engine(deployment)
        except HotloadError as err:
            log.error(
                "cannot build the engine adapter", extra={**self._context(), "error": str(err)}
            )

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

    # --- the report ----------------------------------------------------------------------

    def _report(self) -> None:
        """Publish what the pod must say, from what is known now (the writer repairs any
        difference on the Pod, whoever made it)."""
        memory = self._memory
        target = self._target()
        serving = memory.serving
        hold = memory.hold
        state = replica_state(target, serving, hold)
        status = self._status
        if status.state is not state:
            status.since = datetime.now(UTC)
        status.state = state
        failed = state is ReplicaState.FAILED and hold is not None
        status.reason = hold.reason if failed and hold else None
        status.message = hold.message if failed and hold else None
        status.current = (
            SnapshotRef(
                identity=serving.identity,
                step=serving.step,
                kind=serving.kind,
                kv_cache_policy=target.kv_cache_policy if target else KvCachePolicy.ALL,
            )
            if serving is not None
            else None
        )
        status.current_via = serving.via if serving else None
        annotations = PodAnnotations(
            snapshot=serving.identity if serving else None,
            target=target.identity if target else None,
            state=state,
            since=status.since,
            via=serving.via if serving else None,
            reason=hold.reason if failed and hold else None,
            message=hold.message if failed and hold else None,
            failed_snapshot=hold.failed_snapshot if failed and hold else None,
        )
        deployment = self._deployment
        max_stale = deployment.spec.hot_load.max_stale_steps if deployment else None
        gate = readiness_gate(
            serving.step if serving else None,
            serving.identity if serving else None,
            target.step if target else None,
            max_stale,
        )
        self.writer.publish(annotations, gate)
