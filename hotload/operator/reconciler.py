"""One RolloutDeployment's reconcile loop: observe, plan, execute, repeat.

It runs as the deployment's kopf daemon (so it runs only on the peering leader, and
stops when the deployment is deleted or the operator pauses). Its own watch of the
deployment's pods (the shared :class:`~hotload.kube.reflector.Reflector`) and kopf's
watch events of the deployment, its owned objects and the namespace's PolicySnapshots
update its view and poke it (``batching.Wakeup``); it reconciles after the batch window,
and at least every ``resync_s`` anyway. Each reconcile plans from the whole view
(``plan.plan_deployment``) and writes only the differences. Its view is seeded by LISTs
when it starts, after any failed call (an API outage may have hidden deletions), and
every ``relist_s``: nothing depends on having seen every event.

It runs on every operator replica (a hot standby keeps its view current) but plans and
writes only while its replica leads (``fencing.Leadership``); each time leadership is
gained it lists everything afresh, since another leader wrote meanwhile. Events are
emitted before the writes that record what they announce, so a leader stopped between the
two is followed by one that announces it again: the worst outcome is an Event twice. A
write refused because the object moved on since the view it was planned from (409) makes
it read afresh and plan again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from hotload.api import (
    ConditionStatus,
    IncrementalSpec,
    PolicySnapshotSpec,
    RolloutDeployment,
    RolloutDeploymentSpec,
    SnapshotRef,
)
from hotload.api import conditions as cond
from hotload.api.conditions import CHAIN_VALID, parse_time
from hotload.api.kinds import Identity
from hotload.api.labels import (
    DELETION_HELD_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_OPERATOR,
    SERVED_FINALIZER,
)
from hotload.errors import KubeConflict, KubeError, KubeNotFound, NotLeader
from hotload.kube.cache import Versioned, VersionedStore, is_newer
from hotload.kube.reflector import Reflector
from hotload.operator.batching import BatchWindows, Wakeup
from hotload.operator.executor import KubeExecutor
from hotload.operator.ledger import parse_ledger
from hotload.operator.metrics import OperatorMetrics
from hotload.operator.plan import (
    DeploymentPlan,
    Observation,
    ObservedDeployment,
    plan_deployment,
    recorded_ref,
)
from hotload.operator.pods import PodReport, pod_report
from hotload.operator.rollout import ChainVerdict, Checkpoint, SnapshotInfo
from hotload.operator.snapshot_status import ObservedSnapshot
from hotload.operator.switch import switch_facts
from hotload.operator.workload import label_selector, render_workload
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

DELETED: Final = "DELETED"
UNAUTHORIZED: Final = 401


@dataclass(frozen=True)
class ReconcileTiming:
    windows: BatchWindows = field(default_factory=BatchWindows)
    resync_s: float = 30.0
    """Reconcile at least this often, poked or not (level-triggered safety net)."""
    relist_s: float = 300.0
    """List pods and snapshots afresh at least this often."""
    status_interval_s: float = 5.0
    """Deployment status writes that change only counts or messages wait this long since
    the last write (every sidecar watches the deployment; target moves never wait)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff after a failed reconcile (the project's one policy: 0.5 s doubling to 30 s)."""
    conflicts_before_backoff: int = 3
    """Conflicting writes (409) planned again at once before the backoff applies."""


def _checkpoint(incremental: IncrementalSpec | None) -> Checkpoint | None:
    """The checkpoint a delta's spec names, for retention (None: none named)."""
    if incremental is None or incremental.checkpoint is None:
        return None
    return Checkpoint(incremental.checkpoint.identity, incremental.checkpoint.of)


def observed_snapshot(body: Mapping[str, Any]) -> ObservedSnapshot | None:
    """A PolicySnapshot body as the planners see it; None when its spec is not ours to read."""
    metadata = body.get("metadata") or {}
    try:
        spec = PolicySnapshotSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        log.warning(
            "PolicySnapshot with an unreadable spec ignored",
            extra={"namespace": metadata.get("namespace"), "snapshot": metadata.get("name")},
        )
        return None
    status: Mapping[str, Any] = body.get("status") or {}
    incremental: IncrementalSpec | None = spec.incremental
    recorded = cond.find_wire(status.get("conditions") or [], CHAIN_VALID)
    verdict = None
    if recorded is not None:
        try:
            verdict = ChainVerdict(
                ConditionStatus(str(recorded.get("status"))),
                str(recorded.get("reason") or ""),
                str(recorded.get("message") or ""),
            )
        except ValueError:
            verdict = None
    info = SnapshotInfo(
        identity=spec.identity,
        deployment=spec.deployment_ref.name,
        step=spec.step,
        kind=spec.kind,
        previous=incremental.previous_identity if incremental else None,
        compression_format=incremental.compression_format if incremental else None,
        checksum_format=incremental.checksum_format if incremental else None,
        kv_cache_policy=spec.kv_cache_policy,
        recorded=verdict,
        digest=spec.digest,
        checkpoint=_checkpoint(incremental),
        deleting=metadata.get("deletionTimestamp") is not None,
        switch=switch_facts(metadata.get("annotations") or {}),
    )
    ledger = parse_ledger(status.get("replicas"))
    return ObservedSnapshot(
        info=info,
        uid=metadata.get("uid") or "",
        created=parse_time(metadata.get("creationTimestamp")),
        generation=metadata.get("generation"),
        status=status,
        ledger=ledger,
        finalizers=tuple(str(f) for f in metadata.get("finalizers") or ()),
        deletion_announced=DELETION_HELD_ANNOTATION in (metadata.get("annotations") or {}),
    )


class DeploymentReconciler:
    """Keeps one RolloutDeployment's workload and statuses equal to what its plan says."""

    def __init__(
        self,
        namespace: str,
        name: str,
        executor: KubeExecutor,
        metrics: OperatorMetrics,
        timing: ReconcileTiming,
        sidecar_cluster_role: str,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self._executor = executor
        self._metrics = metrics
        self._timing = timing
        self._cluster_role = sidecar_cluster_role
        self.wakeup = Wakeup(timing.windows)
        self._deployment: dict[str, Any] | None = None
        self._deployment_version = ""
        self._spec: RolloutDeploymentSpec | None = None
        self._spec_generation: int | None = None
        self._pods: VersionedStore[PodReport] = VersionedStore()
        self._snapshots: VersionedStore[ObservedSnapshot] = VersionedStore()
        self._workload_dirty = True
        self._seeded = False
        self._last_status_write = float("-inf")
        """Loop time of the last deployment status write (the loop's clock, as the wake-ups')."""
        self._deferred = False
        self._snapshot_writes: dict[str, float] = {}
        """Loop time of each snapshot's last status write (progress-only writes wait)."""
        self._progress_due = float("-inf")
        """When the wake-up for a waiting progress-only write is set (one at a time)."""
        self._owned_generations: dict[tuple[str, str], int | None] = {}
        self._tenure = 0
        """The leadership tenure this reconciler's view was listed in (0: none yet)."""
        self._announced: set[tuple[str, str, str, str]] = set()
        """Events emitted whose writes have not all landed yet (a failed pass plans them
        again: they are not emitted again in this tenure)."""
        self._written_target: SnapshotRef | None = None
        """The target as this reconciler last wrote it (or found it when its tenure began)."""
        self._wake: tuple[datetime, asyncio.TimerHandle] | None = None
        """The reconcile asked for at a plan's ``wake_at`` (a coordinated switch's deadline)."""
        self.reconciles = 0

    def _context(self, **extra: Any) -> dict[str, Any]:
        return {"namespace": self.namespace, "deployment": self.name, **extra}

    # --- events from kopf handlers ------------------------------------------------------

    def on_deployment(self, body: Mapping[str, Any], *, poke: bool = True) -> None:
        metadata = body.get("metadata") or {}
        version = str(metadata.get("resourceVersion") or "")
        if (
            self._deployment is not None
            and self._deployment_version
            and (
                version == self._deployment_version
                or not is_newer(version, self._deployment_version)
            )
        ):
            return
        generation = metadata.get("generation")
        status = dict(body.get("status") or {})
        # A spec change, or a target another writer changed: both are handled at once.
        urgent = generation != self._spec_generation or (
            self._written_target is not None
            and recorded_ref(status, "targetSnapshot") != self._written_target
        )
        self._deployment = {"metadata": dict(metadata), "spec": body.get("spec") or {},
                            "status": status}  # fmt: skip
        self._deployment_version = version
        if urgent:
            self._workload_dirty = True
        if poke:
            self.wakeup.poke(urgent=urgent)

    def on_pod(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of a replica pod (from :meth:`pod_watch`)."""
        report = pod_report(body)
        if report is None or report.deployment != self.name:
            return
        if event_type == DELETED:
            changed = self._pods.delete(report.name, report.uid, report.resource_version)
        else:
            report = self._seen(report)
            changed = self._pods.upsert(report.name, report.uid, report.resource_version, report)
        if changed:
            self.wakeup.poke()

    def _seen(self, report: PodReport) -> PodReport:
        """The report with when we first saw it claim what it claims now (its standing)."""
        held = self._pods.get(report.name)
        if held is not None and held.uid == report.uid and held.report_key == report.report_key:
            first = held.first_seen
        else:
            first = datetime.now(UTC)
        return dataclasses.replace(report, first_seen=first)

    def on_snapshot(
        self, event_type: str | None, body: Mapping[str, Any], *, poke: bool = True
    ) -> None:
        metadata = body.get("metadata") or {}
        name = metadata.get("name") or ""
        uid = metadata.get("uid") or ""
        version = str(metadata.get("resourceVersion") or "")
        if event_type == DELETED:
            if self._snapshots.delete(name, uid, version):
                self.wakeup.poke(urgent=True)
            return
        if self._snapshots.holds(name, version):
            return  # our own write coming back: its response is what we hold already
        observed = observed_snapshot(body)
        if observed is None:
            return
        held = self._snapshots.get(name)
        # A new snapshot moves the target, a switch decision reaches it: both at once.
        urgent = held is None or held.info.switch != observed.info.switch
        if self._snapshots.upsert(name, uid, version, observed) and poke:
            self.wakeup.poke(urgent=urgent)

    def on_owned(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """An owned object changed: re-apply when its spec moved or it was deleted."""
        metadata = body.get("metadata") or {}
        key = (str(body.get("kind") or ""), str(metadata.get("name") or ""))
        generation = metadata.get("generation")
        if event_type == DELETED or self._owned_generations.get(key, -1) != generation:
            self._owned_generations[key] = generation if event_type != DELETED else None
            self._workload_dirty = True
            self.wakeup.poke()

    # --- the loop -------------------------------------------------------------------------

    def on_pod_list(self, items: Sequence[Mapping[str, Any]], version: str) -> None:
        """A fresh LIST of the deployment's pods: what it lacks and is older is gone."""
        listed: dict[str, Versioned[PodReport]] = {}
        for item in items:
            report = pod_report(item)
            if report is not None and report.deployment == self.name:
                report = self._seen(report)
                listed[report.name] = Versioned(report.uid, report.resource_version, report)
        self._pods.reseed(listed, version)
        self.wakeup.poke()

    def pod_watch(self) -> Reflector:
        """The list+watch of this deployment's pods that feeds :meth:`on_pod`.

        Its own, not kopf's ``@kopf.on.event``: kopf spends about 1.5 ms of CPU on every
        watch event (its per-object queue, body views, loggers and handler kwargs), and a
        rollout makes about three pod events per replica; at 1,000 replicas that is
        seconds of operator CPU per snapshot (bench/propagation). The reconciler starts it
        afresh with each leadership tenure (so a standby holds no pod watch)."""
        selector = f"{label_selector(self.name)},{MANAGED_BY_LABEL}={MANAGED_BY_OPERATOR}"
        return Reflector(
            lambda: self._executor.api,
            f"/api/v1/namespaces/{self.namespace}/pods",
            self.on_pod_list,
            self.on_pod,
            params=[("labelSelector", selector)],
            context={"namespace": self.namespace, "deployment": self.name},
        )

    async def run(self) -> None:
        """Reconcile while this replica leads, until cancelled (kopf cancels it when the
        daemon stops)."""
        leadership = self._executor.leadership
        watching: asyncio.Task[None] | None = None
        try:
            log.info("reconciler started", extra=self._context())
            while True:
                tenure = await leadership.wait_leading()
                # A new tenure: another leader may have written meanwhile, and a process
                # that was frozen slept through its watches. Everything is listed afresh.
                if watching is not None:
                    watching.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watching
                watch = self.pod_watch()
                watching = asyncio.create_task(
                    watch.run(), name=f"pods of {self.namespace}/{self.name}"
                )
                await watch.listed.wait()  # never plan on a partial view of the replicas
                self._tenure = tenure
                self._seeded = False
                self._workload_dirty = True
                self._written_target = None
                self._announced.clear()
                log.info("reconciling as the leader", extra=self._context(tenure=tenure))
                await self._loop(tenure)
                log.info("not the leader any more: reconciling paused", extra=self._context())
        finally:
            if watching is not None:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching

    def _leads(self, tenure: int) -> bool:
        leadership = self._executor.leadership
        return leadership.leading and leadership.tenure == tenure

    async def _refresh_deployment(self) -> None:
        try:
            body = await self._executor.get_deployment(self.namespace, self.name)
        except KubeNotFound:
            return  # being deleted: kopf stops this daemon
        self.on_deployment(body, poke=False)

    async def _loop(self, tenure: int) -> None:
        """Reconcile until the tenure ``tenure`` ends."""
        backoff = Backoff(self._timing.retry)
        last_list = 0.0
        conflicts = 0
        while self._leads(tenure):
            try:
                if not self._seeded or time.monotonic() - last_list > self._timing.relist_s:
                    await self._refresh_deployment()
                    if self._written_target is None and self._deployment is not None:
                        # What the last leader wrote, as this tenure begins.
                        self._written_target = recorded_ref(
                            self._deployment["status"], "targetSnapshot"
                        )
                    await self._seed()
                    last_list = time.monotonic()
                await self.reconcile()
                backoff.reset()
                conflicts = 0
            except NotLeader:
                return
            except KubeConflict as err:
                # Planned on a view older than an object: read afresh, plan again.
                self._seeded = False
                conflicts += 1
                self._metrics.reconcile_errors.labels(self.namespace, self.name, err.reason).inc()
                log.info("a write met a newer object; planning again",
                         extra=self._context(error=str(err)))  # fmt: skip
                if conflicts > self._timing.conflicts_before_backoff:
                    await asyncio.sleep(backoff.next_delay())
                continue
            except Exception as err:  # a reconciler never dies: it logs and retries
                self._seeded = False
                self._workload_dirty = True
                reason = err.reason if isinstance(err, KubeError) else type(err).__name__
                self._metrics.reconcile_errors.labels(self.namespace, self.name, reason).inc()
                if isinstance(err, KubeError) and err.status == UNAUTHORIZED:
                    await self._executor.reconnect()  # the token was rotated under us
                delay = backoff.next_delay()
                log.warning(
                    "reconcile failed, retrying",
                    exc_info=not isinstance(err, KubeError),
                    extra=self._context(error=str(err), retry_in_s=round(delay, 2)),
                )
                await asyncio.sleep(delay)
                continue
            await self.wakeup.wait(self._timing.resync_s)

    async def _seed(self) -> None:
        """List the namespace's PolicySnapshots afresh (the pods have their own watch)."""
        snapshots = await self._executor.list_snapshots(self.namespace)
        listed: dict[str, Versioned[ObservedSnapshot]] = {}
        for item in snapshots.get("items") or []:
            observed = observed_snapshot(item)
            if observed is not None:
                version = str(item["metadata"].get("resourceVersion") or "")
                listed[observed.info.identity] = Versioned(observed.uid, version, observed)
        self._snapshots.reseed(
            listed, str((snapshots.get("metadata") or {}).get("resourceVersion"))
        )
        self._seeded = True
        log.debug(
            "view seeded",
            extra=self._context(pods=len(self._pods), snapshots=len(self._snapshots)),
        )

    def _deployment_model(self) -> RolloutDeployment | None:
        body = self._deployment
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        generation = body["metadata"].get("generation")
        if self._spec is None or generation != self._spec_generation:
            try:
                self._spec = RolloutDeploymentSpec.model_validate(body["spec"])
            except ValidationError as err:
                log.error(
                    "RolloutDeployment spec is invalid; not reconciling it",
                    extra=self._context(error=str(err)),
                )
                return None
            self._spec_generation = generation
        return RolloutDeployment(metadata=body["metadata"], spec=self._spec)

    async def reconcile(self) -> DeploymentPlan | None:
        """One pass: apply the workload if it may differ, then plan and write statuses."""
        deployment = self._deployment_model()
        if deployment is None or self._deployment is None:
            return None
        started = time.perf_counter()
        self.reconciles += 1
        if self._workload_dirty:
            self._workload_dirty = False
            try:
                for obj in render_workload(deployment, self._cluster_role):
                    obj["metadata"].setdefault("namespace", self.namespace)
                    await self._executor.apply(obj)
            except KubeError:
                self._workload_dirty = True
                raise
        observation = Observation(
            deployment=ObservedDeployment(
                name=self.name,
                namespace=self.namespace,
                uid=str(deployment.metadata.get("uid") or ""),
                generation=deployment.metadata.get("generation"),
                spec=deployment.spec,
                status=self._deployment["status"],
                written_target=self._written_target,
            ),
            pods=self._pods.values(),
            snapshots=dict(self._snapshots.items()),
        )
        now = datetime.now(UTC)
        plan = plan_deployment(observation, now)
        self._wake_at(plan.wake_at, now)
        await self._execute(plan, observation)
        if plan.recheck_at is not None:
            # A report not corroborated yet will have stood long enough then: plan again.
            self.wakeup.poke_later(max(0.0, (plan.recheck_at - now).total_seconds()) + 0.05)
        self._metrics.reconcile_seconds.labels(self.namespace, self.name).observe(
            time.perf_counter() - started
        )
        return plan

    def _wake_at(self, moment: datetime | None, now: datetime) -> None:
        """Reconcile at ``moment`` (urgently), once; a plan that no longer asks cancels it."""
        if self._wake is not None and self._wake[0] == moment:
            return
        if self._wake is not None:
            self._wake[1].cancel()
            self._wake = None
        if moment is not None:
            delay = max(0.0, (moment - now).total_seconds())
            handle = asyncio.get_running_loop().call_later(
                delay, functools.partial(self.wakeup.poke, urgent=True)
            )
            self._wake = (moment, handle)

    async def _execute(self, plan: DeploymentPlan, observation: Observation) -> None:
        # Events first: what they announce is recorded by the writes below, so a leader
        # stopped in between leaves the announcement to its successor (at worst twice),
        # never to nobody.
        for event in plan.events:
            announced = (event.kind, event.name, event.reason, event.message)
            if announced in self._announced:
                continue  # announced already; the write that records it has not landed yet
            try:
                await self._executor.emit(self.namespace, event)
            except NotLeader:
                raise
            except KubeError as err:
                log.warning("could not emit an Event", extra=self._context(error=str(err)))
            self._announced.add(announced)
        # Guards first: a snapshot carries its finalizer before the target names it.
        for identity, metadata in plan.metadata_patches.items():
            await self._write_snapshot_metadata(identity, metadata)
        # A break is recorded on its snapshot first: that record outlives the pod's report.
        breaking = [i for i in plan.snapshot_patches if plan.verdicts[i].broken]
        for identity in breaking:
            await self._write_snapshot(identity, plan.snapshot_patches[identity])
        await self._write_deployment_status(plan)
        for identity, patch in plan.snapshot_patches.items():
            if identity in breaking or self._progress_waits(identity, plan):
                continue
            await self._write_snapshot(identity, patch)
        for identity, uid in plan.deletions:
            with contextlib.suppress(KubeNotFound):
                await self._executor.delete_snapshot(
                    self.namespace, identity, uid, self._snapshots.resource_version(identity)
                )
            self._snapshots.delete(identity, uid, "")
            self._snapshot_writes.pop(identity, None)
        for identity, seconds in plan.propagated:
            self._metrics.propagation_seconds.labels(self.namespace, self.name).observe(seconds)
            log.info(
                "snapshot propagated",
                extra=self._context(snapshot=identity, seconds=round(seconds, 3)),
            )
        if plan.target.move.value not in ("None", "Refresh") and plan.target.target is not None:
            log.info(
                "target moved",
                extra=self._context(
                    snapshot=plan.target.target.identity, move=plan.target.move.value
                ),
            )
        self._announced.clear()  # every write landed: what they announce is recorded
        counts: dict[str, int] = {}
        for pod in observation.pods:
            if pod.is_desired(observation.deployment.spec.replicas):
                key = pod.state.value if pod.state else "Pending"
                counts[key] = counts.get(key, 0) + 1
        self._metrics.set_replicas(self.namespace, self.name, counts)

    async def _write_snapshot_metadata(
        self, identity: Identity, metadata: Mapping[str, Any]
    ) -> None:
        try:
            body = await self._executor.patch_snapshot_metadata(
                self.namespace, identity, metadata, self._snapshots.resource_version(identity)
            )
        except KubeNotFound:
            return
        self.on_snapshot(None, body, poke=False)

    async def release_guards(self) -> None:
        """The deployment is gone: its snapshots lose the ``hotload.dev/served`` finalizer
        (no reconciler would ever remove it). Only the leader can; errors are logged."""
        for identity, observed in self._snapshots.items():
            if observed.info.deployment != self.name or SERVED_FINALIZER not in observed.finalizers:
                continue
            try:
                body = await self._executor.get_snapshot(self.namespace, identity)
                metadata = body.get("metadata") or {}
                kept = [f for f in metadata.get("finalizers") or () if f != SERVED_FINALIZER]
                await self._executor.patch_snapshot_metadata(
                    self.namespace, identity, {"finalizers": kept},
                    str(metadata.get("resourceVersion") or "") or None,
                )  # fmt: skip
            except KubeNotFound:
                continue
            except (NotLeader, KubeError) as err:
                log.warning(
                    "could not release a snapshot of a deleted deployment",
                    extra=self._context(snapshot=identity, error=str(err)),
                )

    def _progress_waits(self, identity: Identity, plan: DeploymentPlan) -> bool:
        """Whether a snapshot's progress-only write waits (``status_interval_s`` since its
        last write; a wake-up is set for when it comes due)."""
        if identity not in plan.progress_only:
            return False
        now = asyncio.get_running_loop().time()
        due = self._snapshot_writes.get(identity, float("-inf")) + self._timing.status_interval_s
        if due <= now:
            return False
        if not now < self._progress_due <= due:  # no wake-up set yet that comes in time
            self._progress_due = due
            self.wakeup.poke_later(due - now)
        return True

    async def _write_snapshot(self, identity: Identity, patch: Mapping[str, Any]) -> None:
        try:
            body = await self._executor.patch_snapshot_status(
                self.namespace, identity, patch, self._snapshots.resource_version(identity)
            )
        except KubeNotFound:
            observed = self._snapshots.get(identity)
            if observed is not None:
                self._snapshots.delete(identity, observed.uid, "")
            return
        # Stamped once written: a failed write must not make the retry's progress wait.
        self._snapshot_writes[identity] = asyncio.get_running_loop().time()
        self.on_snapshot(None, body, poke=False)

    async def _write_deployment_status(self, plan: DeploymentPlan) -> None:
        if plan.status_patch is None:
            self._deferred = False
            return
        clock = asyncio.get_running_loop().time
        since = clock() - self._last_status_write
        if not plan.status_material and since < self._timing.status_interval_s:
            if not self._deferred:
                self._deferred = True
                self.wakeup.poke_later(self._timing.status_interval_s - since)
            return
        body = await self._executor.patch_deployment_status(
            self.namespace, self.name, plan.status_patch, self._deployment_version or None
        )
        self._written_target = recorded_ref(body.get("status") or {}, "targetSnapshot")
        self._last_status_write = clock()
        self._deferred = False
        self.on_deployment(body, poke=False)
