"""The weight-swap agent: watch the target, fetch, verify, rebuild, swap, report.

One class, built from one frozen :class:`AgentConfig` plus what is passed in (the
Kubernetes API client, a prometheus ``CollectorRegistry``, the engine or a factory that
builds it from the deployment's ``spec.engine``). It runs until cancelled. Everything is
per instance (no module globals, no default registry), so the pod runtime can run many
agents as asyncio tasks in one process.

The loop (DESIGN.md, Flow steps 3-5): the deployment watch hands over every new state;
when the target differs from what the engine serves, a load starts (plan, fetch, verify,
rebuild into staging — beside live serving), then the swap (the only step that touches
traffic), then the KV-cache policy, then staging is cleaned. A newer target preempts a
load that has not reached its swap. Transient failures (``NotFound``,
``StorageUnavailable``, ``EngineBusy``, ``EngineUnavailable``) are retried with backoff
and jitter while the state stays Loading; any other failure marks the target Failed with
its reason and the replica keeps serving its last good snapshot until the target moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
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
from hotload.api.pod import ANNOTATION_SNAPSHOT, ANNOTATION_VIA
from hotload.engines.protocol import Engine, PauseMode
from hotload.errors import HotloadError, NotFound
from hotload.retry import Backoff
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher
from hotload.sidecar.http_server import serve_front
from hotload.sidecar.loader import LoadTimings, SnapshotLoader, StagedSnapshot
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.pod_report import PodAnnotations, readiness_gate
from hotload.sidecar.pod_writer import ObservedPod, PodWriter
from hotload.sidecar.staging import StagingArea
from hotload.sidecar.status import AgentStatus, ErrorRecord, Phase, StatusReport, SwapRecord
from hotload.sidecar.swap_gate import SwapGate
from hotload.storage import Storage, open_storage

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

    from hotload.api import EngineSpec

log = logging.getLogger(__name__)

#: Builds the engine adapter once the deployment says which engine the pod runs.
EngineFactory = Callable[["EngineSpec"], Engine]

#: How long one attempt waits for the engine to answer before it counts as unavailable.
ENGINE_READY_TIMEOUT_S = 10.0
#: Reason written when something that is not a hotload error ended a load (a bug).
INTERNAL_REASON = "InternalError"


def _storage_settings(deployment: RolloutDeployment) -> tuple[str, str | None, str | None]:
    hot_load = deployment.spec.hot_load
    return hot_load.bucket_url, hot_load.endpoint, hot_load.region


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
        self.writer = PodWriter(api, config.namespace, config.pod_name, config.retry)
        self._deployment: RolloutDeployment | None = None
        self._wake = asyncio.Event()
        self._storage: Storage | None = None
        self._storage_key: tuple[str, str | None, str | None] | None = None
        self._loader: SnapshotLoader | None = None
        self._recovered = False
        self._observed: ObservedPod | None = None
        self._failed_target: str | None = None
        self._served_name: str | None = None
        self._background: set[asyncio.Task[None]] = set()
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
        current = self._status.current
        return current.identity if current else None

    def status_report(self) -> StatusReport:
        deployment = self._deployment
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
        self._observed = await self._observe_pod()
        watcher = DeploymentWatcher(
            self.api,
            self.config.namespace,
            self.config.deployment,
            self.config.retry,
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
        backoff = Backoff(self.config.retry)
        while True:
            try:
                return await self.writer.observe()
            except HotloadError as err:
                if not err.transient:
                    log.error("cannot read own pod", extra={**self._context(), "error": str(err)})
                    return None
                await backoff.wait()

    def _context(self) -> dict[str, str]:
        return {"pod": self.config.pod_name, "namespace": self.config.namespace}

    def _on_deployment(self, view: DeploymentView) -> None:
        """From the watch: remember the newest state and wake the reconcile loop."""
        self._deployment = view.deployment
        deployment = view.deployment
        target = None
        if deployment is not None:
            self._served_name = deployment.spec.model.served_name
            if deployment.status is not None:
                target = deployment.status.target_snapshot
        if target is not None:
            self._metrics.target_step.set(target.step)
        self._wake.set()

    def _target(self) -> SnapshotRef | None:
        deployment = self._deployment
        if deployment is None or deployment.status is None:
            return None
        return deployment.status.target_snapshot

    async def _reconcile(self) -> None:
        """Follow the target, one load at a time; a newer target preempts a load."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            target = self._target()
            self._status.target = target
            if self._deployment is not None and self._engine is None:
                self._engine_for_probes(self._deployment)
            if self._deployment is None or target is None:
                self._set_phase(Phase.WAITING)
                self._report()
                continue
            if target.identity == self._failed_target:
                self._report()
                continue
            current = self._status.current
            if self._recovered and current is not None and current.identity == target.identity:
                self._transition(ReplicaState.READY, Phase.IDLE)
                continue
            await self._follow(target)
            if self._target() != target:
                self._wake.set()

    async def _follow(self, target: SnapshotRef) -> None:
        """Run one load of ``target``; cancel it when the target moves before its swap."""
        work = asyncio.create_task(self._settle_with_retries(target), name="load")
        try:
            while not work.done():
                waker = asyncio.create_task(self._wake.wait())
                await asyncio.wait({work, waker}, return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
                if not self._wake.is_set() or work.done():
                    continue
                self._wake.clear()
                newer = self._target()
                if newer == target or self._status.phase is Phase.SWAPPING:
                    continue
                log.info(
                    "target moved; abandoning the load in progress",
                    extra={**self._context(), "snapshot": target.identity},
                )
                work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
        finally:
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work

    async def _settle_with_retries(self, target: SnapshotRef) -> None:
        """Bring the engine to ``target``: retry transient failures, record the others."""
        backoff = Backoff(self.config.retry)
        while True:
            try:
                await self._settle(target)
                return
            except HotloadError as err:
                self._metrics.failures.labels(reason=err.reason).inc()
                self._status.last_error = ErrorRecord(
                    reason=err.reason,
                    message=str(err),
                    transient=err.transient,
                    target=target.identity,
                    at=datetime.now(UTC),
                )
                if not err.transient:
                    self._fail(target, err.reason, str(err))
                    return
                delay = backoff.next_delay()
                log.warning(
                    "load failed transiently; retrying",
                    extra={
                        **self._context(),
                        "snapshot": target.identity,
                        "reason": err.reason,
                        "error": str(err),
                        "retry_in_s": round(delay, 2),
                    },
                )
                self._set_phase(Phase.RETRYING)
                await asyncio.sleep(delay)
            except Exception as err:  # a bug or an unmapped failure: recorded, never fatal
                log.exception(
                    "load failed unexpectedly",
                    extra={**self._context(), "snapshot": target.identity},
                )
                self._metrics.failures.labels(reason=INTERNAL_REASON).inc()
                self._status.last_error = ErrorRecord(
                    reason=INTERNAL_REASON,
                    message=f"{type(err).__name__}: {err}",
                    transient=False,
                    target=target.identity,
                    at=datetime.now(UTC),
                )
                self._fail(target, INTERNAL_REASON, f"{type(err).__name__}: {err}")
                return

    async def _settle(self, target: SnapshotRef) -> None:
        """One attempt: learn what the engine serves, then load the target unless served."""
        deployment = self._deployment
        if deployment is None:
            return
        engine = self._ensure_engine(deployment)
        loader = self._ensure_loader(deployment)
        await engine.wait_ready(ENGINE_READY_TIMEOUT_S)
        if not self._recovered:
            await self._recover(engine, loader, target)
        current = self._status.current
        if current is not None and current.identity == target.identity:
            self._status.current = target
            self._failed_target = None
            self._transition(ReplicaState.READY, Phase.IDLE)
            return
        if self._status.state is not ReplicaState.LOADING:
            self._transition(ReplicaState.LOADING, Phase.PLANNING)
        held = current.identity if current and self.staging.has_snapshot(current.identity) else None
        timings = LoadTimings()
        started = datetime.now(UTC)
        staged = await loader.stage(held, target, timings)
        self._set_phase(Phase.SWAPPING)
        with timings.phase("swap", self._metrics):
            await self._swap(engine, staged, deployment.spec.hot_load.transition, target)
        self._served(staged, timings, started)
        await asyncio.to_thread(self.staging.clean, {target.identity}, set())

    async def _swap(
        self, engine: Engine, staged: StagedSnapshot, transition: Transition, target: SnapshotRef
    ) -> None:
        """Hand the verified directory to the engine; the only step that touches traffic."""
        identity = staged.ref.identity
        kind = staged.manifest.kind
        async with self._gate.swapping(transition):
            if transition is Transition.ASYNC:
                await engine.pause(PauseMode.IN_PLACE)
                try:
                    await engine.load_weights(staged.engine_path, identity, kind=kind)
                    self._status.current = target
                finally:
                    await engine.resume()
            else:
                await engine.load_weights(staged.engine_path, identity, kind=kind)
                self._status.current = target
            await self._apply_cache_policy(engine, target.kv_cache_policy)

    async def _apply_cache_policy(self, engine: Engine, policy: KvCachePolicy) -> None:
        """The KV-cache policy after a swap; a refusal is recorded, the swap stands."""
        try:
            await engine.reset_cache(policy)
        except HotloadError as err:
            self._metrics.failures.labels(reason=err.reason).inc()
            log.warning(
                "KV-cache policy not applied after the swap",
                extra={**self._context(), "policy": policy.value, "error": str(err)},
            )

    def _served(self, staged: StagedSnapshot, timings: LoadTimings, started: datetime) -> None:
        ref = staged.ref
        self._status.current = ref
        self._status.current_via = staged.via
        self._failed_target = None
        self._metrics.swaps.labels(via=staged.via.value).inc()
        self._metrics.set_served(ref.identity, ref.step, ref.kind.value)
        seconds = {name: round(value, 6) for name, value in timings.seconds.items()}
        seconds["total"] = round((datetime.now(UTC) - started).total_seconds(), 6)
        self._status.history.append(
            SwapRecord(
                identity=ref.identity,
                step=ref.step,
                kind=ref.kind.value,
                via=staged.via,
                outcome=ReplicaState.READY,
                started_at=started,
                finished_at=datetime.now(UTC),
                seconds=seconds,
                fetched_bytes=timings.fetched_bytes,
                stored_bytes=timings.stored_bytes,
            )
        )
        log.info(
            "snapshot swapped in",
            extra={
                **self._context(),
                "snapshot": ref.identity,
                "step": ref.step,
                "via": staged.via.value,
                "seconds": seconds,
                "fetched_bytes": timings.fetched_bytes,
            },
        )
        self._transition(ReplicaState.READY, Phase.IDLE)

    def _fail(self, target: SnapshotRef, reason: str, message: str) -> None:
        """The target cannot be loaded: keep serving the last good snapshot, say why."""
        self._failed_target = target.identity
        now = datetime.now(UTC)
        self._status.history.append(
            SwapRecord(
                identity=target.identity,
                step=target.step,
                kind=target.kind.value,
                outcome=ReplicaState.FAILED,
                reason=reason,
                started_at=now,
                finished_at=now,
            )
        )
        log.error(
            "target snapshot failed; serving the last good one",
            extra={
                **self._context(),
                "snapshot": target.identity,
                "reason": reason,
                "error": message,
                "serving": self.served_identity(),
            },
        )
        self._transition(ReplicaState.FAILED, Phase.FAILED, reason=reason, message=message)

    async def _recover(self, engine: Engine, loader: SnapshotLoader, target: SnapshotRef) -> None:
        """After a (re)start: what does the engine serve, and is its rebuild still staged?"""
        identity = await engine.served_identity()
        if identity is None:
            self._recovered = True
            return
        staged = await asyncio.to_thread(self.staging.record, identity)
        if staged is not None:
            step, kind = staged.step, staged.kind
        else:
            try:
                manifest = await loader.manifest(identity)
            except NotFound:
                log.warning(
                    "the engine serves a snapshot the bucket no longer has; loading afresh",
                    extra={**self._context(), "snapshot": identity},
                )
                self._recovered = True
                return
            step, kind = manifest.step, manifest.kind
        self._status.current = SnapshotRef(
            identity=identity, step=step, kind=kind, kv_cache_policy=target.kv_cache_policy
        )
        observed = self._observed.annotations if self._observed else {}
        if observed.get(ANNOTATION_SNAPSHOT) == identity and observed.get(ANNOTATION_VIA):
            with contextlib.suppress(ValueError):
                self._status.current_via = LoadPath(observed[ANNOTATION_VIA])
        self._metrics.set_served(identity, step, kind.value)
        self._recovered = True
        log.info(
            "engine already serves a snapshot",
            extra={
                **self._context(),
                "snapshot": identity,
                "staged": self.staging.has_snapshot(identity),
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

    # --- state and reporting -----------------------------------------------------------

    def _set_phase(self, phase: Phase) -> None:
        self._status.phase = phase

    def _set_bytes(self, done: int, total: int) -> None:
        self._status.bytes_done = done
        self._status.bytes_total = total

    def _transition(
        self,
        state: ReplicaState,
        phase: Phase,
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        status = self._status
        if status.state is not state:
            status.since = datetime.now(UTC)
        status.state = state
        status.phase = phase
        status.reason = reason
        status.message = message
        self._report()

    def _report(self) -> None:
        """Publish the current report on the Pod (written in the background)."""
        status = self._status
        current, target = status.current, status.target
        failed = status.state is ReplicaState.FAILED
        annotations = PodAnnotations(
            snapshot=current.identity if current else None,
            target=target.identity if target else None,
            state=status.state,
            since=status.since,
            via=status.current_via,
            reason=status.reason if failed else None,
            message=status.message if failed else None,
            failed_snapshot=target.identity if failed and target else None,
        )
        deployment = self._deployment
        max_stale = deployment.spec.hot_load.max_stale_steps if deployment else None
        gate = readiness_gate(
            current.step if current else None,
            current.identity if current else None,
            target.step if target else None,
            max_stale,
        )
        self.writer.publish(annotations, gate)
