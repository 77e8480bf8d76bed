"""The weight-swap agent: observe, let the planner decide, execute, report.

The operator's shape (docs/architecture.md, "The sidecar"). One agent per pod, from one
frozen :class:`AgentConfig`, the Kubernetes API client, a prometheus registry and the
engine (or a factory building it from ``spec.engine``); all per instance, so the pod
runtime can run many as tasks in one process. This module is only the loop:

- :class:`~hotload.sidecar.observer.EngineObserver` judges the engine and returns an
  :class:`~hotload.sidecar.memory.Observation` (a restart drops the pod's snapshot at
  once: ``SnapshotReady=False/NotLoaded``, no ``snapshot`` annotation, until the served
  buffer is reloaded);
- :func:`~hotload.sidecar.backward.refuse_backward` first refuses a target another
  writer moved back (nothing older is loaded, the job in flight goes on);
- :func:`~hotload.sidecar.planning.next_step` picks the one thing to do, and
  :class:`~hotload.sidecar.jobs.JobRunner` takes that step as a job and returns its
  outcome — or gives way: :func:`~hotload.sidecar.planning.should_preempt` cancels the
  job in flight, which stops its threads at their next chunk and returns only when
  staging is free again (one owner);
- :func:`~hotload.sidecar.memory.fold` folds every observation and outcome into the
  agent's :class:`~hotload.sidecar.memory.Memory` (a failure by the planner's
  :func:`~hotload.sidecar.planning.after_failure`: retry with backoff, replay from the
  Full fetched again, or Failed with a reason of :mod:`hotload.api.reasons`);
- :func:`~hotload.sidecar.pod_report.replica_report` says what the pod reports (a
  coordinated switch's phase by :func:`~hotload.sidecar.switch_timing.switch_phase`), and
  the :class:`~hotload.sidecar.pod_writer.PodWriter` repairs whatever differs on the Pod.

The loop wakes on a new deployment state, on a finished job, at a retry's time, and at
least every ``engine_check_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from hotload.engines.protocol import Engine
from hotload.sidecar.agent_view import AgentView
from hotload.sidecar.backward import refuse_backward
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher
from hotload.sidecar.http_server import serve_front
from hotload.sidecar.jobs import JOB_OF_STEP, JobRunner
from hotload.sidecar.memory import (
    AtTarget,
    Fact,
    Memory,
    RetryDue,
    TargetSeen,
    fold,
    loses_serving,
    sets_serving,
)
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.observer import EngineObserver
from hotload.sidecar.parts import AgentParts, EngineFactory
from hotload.sidecar.planning import Step, StepKind, next_step, same_target
from hotload.sidecar.pod_report import replica_report
from hotload.sidecar.pod_writer import ObservedPod, PodWriter, since_of
from hotload.sidecar.status import Phase, current_error
from hotload.sidecar.switch_timing import switch_phase

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

log = logging.getLogger(__name__)

#: The phase ``/status`` shows for the steps that start no job.
_PHASE_OF_STEP = {
    StepKind.WAIT_ENGINE: Phase.WAITING,
    StepKind.HOLD: Phase.FAILED,
    StepKind.CONFIRM: Phase.CONFIRMING,
    StepKind.READY: Phase.IDLE,
}


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
        self._parts = AgentParts(config, AgentMetrics(registry), engine)
        self.staging = self._parts.staging
        self.writer = PodWriter(
            api,
            config.namespace,
            config.pod_name,
            config.api_retry,
            check_interval_s=config.pod_check_interval_s,
        )
        self._memory = Memory()
        self._wake = asyncio.Event()
        self._observed_pod: ObservedPod | None = None
        self._observer = EngineObserver(self._parts, self._remembered, self._pod_annotations)
        self._runner = JobRunner(
            self._parts,
            self._remembered,
            self._apply,
            self._wake.set,
            waiting_for_turn=self.writer.hold_stopped,
        )
        self.view = AgentView(self._parts, registry, self._remembered)
        """What the front reads (gate, metrics, served snapshot, ``/status``)."""
        self.ready = asyncio.Event()
        """Set once the agent has observed its pod and (when serving HTTP) listens."""

    # --- running -----------------------------------------------------------------------

    async def run(self) -> None:
        """Watch, load and report until cancelled; serve HTTP when ``serve_http``."""
        await asyncio.to_thread(self.staging.prepare)
        await self._runner.refresh()
        self._observed_pod = await self.writer.observe_at_start(self._parts.delay)
        # Keep the Pod's ``since`` across a sidecar restart when the state is unchanged.
        self._parts.status.since = since_of(self._observed_pod) or self._parts.status.since
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
                        serve_front(self.view, client, self.config, self.ready), name="http"
                    )
                else:
                    self.ready.set()
        finally:
            await self._runner.stop()
            if client is not None:
                await client.aclose()
            await self._parts.aclose()

    def _pod_annotations(self) -> dict[str, str]:
        return self._observed_pod.annotations if self._observed_pod else {}

    def _on_deployment(self, view: DeploymentView) -> None:
        """From the watch: remember the newest state and wake the loop."""
        self._parts.see_deployment(view.deployment)
        self._wake.set()

    # --- the loop ------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Observe the engine, decide, execute, report; on every wake and at least every
        ``engine_check_interval_s``."""
        while True:
            await self._sleep()
            self._wake.clear()
            self._parts.status.target = self._parts.target()
            if self._parts.deployment is not None and self._parts.engine is None:
                self._parts.engine_for_probes(self._parts.deployment)
            self._runner.reap()
            await self._observe_engine()
            await self._decide()
            await self._runner.resume_if_owed()
            self._report()

    async def _sleep(self) -> None:
        timeout = self.config.engine_check_interval_s
        retry = self._memory.retry
        if retry is not None:
            timeout = min(timeout, max(0.0, retry.at - asyncio.get_running_loop().time()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    async def _observe_engine(self) -> None:
        """Fold what the engine says; once more at once when it no longer serves what the
        pod said (looked at again as a restarted sidecar would)."""
        for _ in range(2):
            observation = await self._observer.observe()
            if observation is None:
                return
            self._parts.status.engine_seen = observation.seen
            self._apply(observation)
            if not observation.again:
                return

    async def _decide(self) -> None:
        target = self._parts.target()
        self._apply(TargetSeen(target))
        refusal = refuse_backward(self._parts.deployment, target, self._memory)
        if refusal is not None:
            if refusal.failed is not None:
                extra = {**self._parts.context(), "target": refusal.failed.failed_identity}
                log.warning("refusing a backward target", extra=extra)
                self._apply(refusal.failed)
            self._parts.status.phase = Phase.FAILED
            return
        if not await self._runner.gives_way(target):
            return
        if self._parts.deployment is None:
            self._parts.status.phase = Phase.WAITING
            return
        retry = self._memory.retry
        if retry is not None:
            if same_target(retry.target, target) and asyncio.get_running_loop().time() < retry.at:
                self._parts.status.phase = Phase.RETRYING
                return
            self._apply(RetryDue())
        memory = self._memory
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
        if step.kind in JOB_OF_STEP:
            self._runner.start(step)
        elif step.kind is StepKind.IDLE:
            idle = Phase.WAITING if self._memory.serving is None else Phase.IDLE
            self._parts.status.phase = idle
        else:
            self._parts.status.phase = _PHASE_OF_STEP[step.kind]
            if step.kind is StepKind.READY:
                self._apply(AtTarget())

    # --- memory ------------------------------------------------------------------------

    def _remembered(self) -> Memory:
        return self._memory

    def _apply(self, fact: Fact) -> None:
        """Fold ``fact`` into the memory; keep the served-snapshot metric in step."""
        self._memory = fold(self._memory, fact)
        serving = self._memory.serving
        if loses_serving(fact):
            self._parts.metrics.clear_served()
            if self._runner.current is not None:
                self._runner.current.engine_lost = True
        if sets_serving(fact) and serving is not None:
            self._parts.metrics.set_served(serving.identity, serving.step, serving.kind.value)

    # --- the report -----------------------------------------------------------------------

    def _report(self) -> None:
        """Publish what the pod must say, from what is known now (the writer repairs any
        difference on the Pod, whoever made it)."""
        status, memory = self._parts.status, self._memory
        deployment = self._parts.deployment
        status.last_error = current_error(status.last_error, self._parts.target())
        report = replica_report(
            self._parts.target(),
            memory.serving,
            memory.hold,
            previous=(status.state, status.since),
            last_error=status.last_error,
            now=datetime.now(UTC),
            max_stale_steps=deployment.spec.hot_load.max_stale_steps if deployment else None,
            switch=switch_phase(self._runner.switch_note, self._parts.target(), memory.serving),
        )
        status.state, status.since = report.state, report.since
        status.reason, status.message = report.reason, report.message
        status.current, status.current_via = report.current, report.via
        self.writer.publish(report.annotations, report.gate)
