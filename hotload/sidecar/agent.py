"""The weight-swap agent: observe, let the planner decide, execute, report.

One class, built from one frozen :class:`AgentConfig` plus what is passed in (the
Kubernetes API client, a prometheus ``CollectorRegistry``, the engine or a factory that
builds it from the deployment's ``spec.engine``). It runs until cancelled. Everything is
per instance (no module globals, no default registry), so the pod runtime can run many
agents as asyncio tasks in one process.

Its parts live apart: this module holds the loop (decide, execute, report);
:mod:`hotload.sidecar.engine_watch` what the engine's report means for the pod;
:mod:`hotload.sidecar.load_jobs` the jobs and their failures; and
:mod:`hotload.sidecar.agent_core` the state they share.

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
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from hotload.api import (
    KvCachePolicy,
    ReplicaState,
    RolloutDeployment,
    SnapshotRef,
)
from hotload.api.pod import ANNOTATION_SINCE
from hotload.cancellation import CancelToken
from hotload.engines.protocol import Engine
from hotload.errors import HotloadError
from hotload.sidecar.agent_core import EngineFactory, Memory, RunningJob
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher
from hotload.sidecar.engine_watch import EngineWatch
from hotload.sidecar.http_server import serve_front
from hotload.sidecar.load_jobs import LoadJobs
from hotload.sidecar.loader import SnapshotLoader
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import (
    Attempts,
    Job,
    Slot,
    Step,
    StepKind,
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
    ErrorRecord,
    Phase,
    StatusReport,
)
from hotload.sidecar.swap_gate import SwapGate
from hotload.storage import Storage

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


log = logging.getLogger(__name__)


def _same_target(a: SnapshotRef | None, b: SnapshotRef | None) -> bool:
    return (a is None and b is None) or same_snapshot(a, b)


class SidecarAgent(EngineWatch, LoadJobs):
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
        self._memory = Memory()
        self._deployment: RolloutDeployment | None = None
        self._wake = asyncio.Event()
        self._storage: Storage | None = None
        self._storage_key: tuple[str, str | None, str | None] | None = None
        self._loader: SnapshotLoader | None = None
        self._job: RunningJob | None = None
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
        # The front's client to the engine, only where there is a front: an httpx client
        # builds an SSL context (milliseconds of CPU, some memory), which a thousand
        # agents in one shared host would each pay for nothing.
        client = (
            httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
            if self.config.serve_http
            else None
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(watcher.run(), name="deployment-watch")
                group.create_task(self.writer.run(), name="pod-writer")
                group.create_task(self._reconcile(), name="reconcile")
                if client is not None:
                    group.create_task(
                        serve_front(self, client, self.config, self.ready), name="http"
                    )
                else:
                    self.ready.set()
        finally:
            await self._stop_job()
            if client is not None:
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
            if self._job is None:
                await self._resume_if_owed()
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
            engine_unconfirmed=memory.unconfirmed,
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
        elif kind is StepKind.CONFIRM:
            self._status.phase = Phase.CONFIRMING
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
        running = RunningJob(job, target, CancelToken())
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

    # --- the engine's word ---------------------------------------------------------------

    # --- jobs ----------------------------------------------------------------------------

    # --- failures ------------------------------------------------------------------------

    # --- building blocks -----------------------------------------------------------------

    def _engine_for_probes(self, deployment: RolloutDeployment) -> None:
        """Build the engine adapter as soon as the deployment names it, so ``/readyz``
        answers for the engine before any target exists."""
        try:
            self._ensure_engine(deployment)
        except HotloadError as err:
            log.error(
                "cannot build the engine adapter", extra={**self._context(), "error": str(err)}
            )

    # --- the report ----------------------------------------------------------------------

    def _retrying_after(
        self, target: SnapshotRef | None, state: ReplicaState | None
    ) -> ErrorRecord | None:
        """While Loading: the transient failure of this target the agent retries after (why
        the replica is not there yet, for ``hotload ledger``/``status``)."""
        error = self._status.last_error
        if state is not ReplicaState.LOADING or target is None or error is None:
            return None
        return error if error.transient and error.target == target.identity else None

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
        retrying = self._retrying_after(target, state)
        annotations = PodAnnotations(
            served_identity=serving.identity if serving else None,
            target_identity=target.identity if target else None,
            state=state,
            since=status.since,
            via=serving.via if serving else None,
            reason=hold.reason if failed and hold else (retrying.reason if retrying else None),
            message=hold.message if failed and hold else (retrying.message if retrying else None),
            failed_identity=hold.failed_identity if failed and hold else None,
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
