"""The agent's jobs: take one step of the planner and return its outcome.

:meth:`JobRunner.run` carries out the step the planner chose
(:func:`~hotload.sidecar.planning.next_step`): patch a one-delta step into an engine
that patches in place (falling back to the directory on a refusal), build the target
into the free buffer and hand it over, hand over a buffer built earlier, reload the
served buffer or settle a load of unknown outcome, or catch staging up with what the
engine serves. It returns None when the step is done, or a
:class:`~hotload.sidecar.memory.Failed` outcome carrying the planner's
:func:`~hotload.sidecar.planning.after_failure` decision, which the loop folds.

It reads the agent's memory and changes it only through facts (:mod:`memory`): the
ones the engine already acts on (a confirmed handover, staging read back, weights lost)
are handed to the loop the moment they are true. What it may touch: the engine (through
:class:`~hotload.sidecar.handover.Handover`, the one place that touches traffic), the
free buffer and the fetch area of staging (through the loader), staging's record of the
buffers' roles, and the bucket (read only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from hotload.api import LoadPath, ReplicaState, SnapshotRef, Transition
from hotload.api.kinds import Identity
from hotload.api.reasons import INTERNAL_ERROR
from hotload.api.switch import SwitchPhase
from hotload.cancellation import Cancelled, CancelToken, run_cancellable, run_in_thread
from hotload.engines.capabilities import PatchesInPlace, patches_in_place, stages_switch
from hotload.engines.protocol import Engine, EngineReport
from hotload.errors import DigestMismatch, HotloadError
from hotload.sidecar.build_slots import build_slot
from hotload.sidecar.handover import Handover, HandoverFailed, PatchRefused
from hotload.sidecar.loader import BuildFailed, LoadTimings, SnapshotLoader, snapshot_at_fault
from hotload.sidecar.memory import (
    BuffersRead,
    CaughtUp,
    Fact,
    Failed,
    Memory,
    Refused,
    ResumeOwed,
    Served,
    Swapped,
    Unusable,
    WeightsLost,
)
from hotload.sidecar.parts import AgentParts, log
from hotload.sidecar.planning import (
    Action,
    Failure,
    FailureDecision,
    Job,
    Route,
    Slot,
    Staged,
    Step,
    StepKind,
    after_failure,
    choose_build,
    choose_route,
    confirms_digest,
    same_snapshot,
    should_preempt,
)
from hotload.sidecar.status import ErrorRecord, Phase, SwapRecord
from hotload.sidecar.switch_timing import coordinates, due, switch_time_of, switched, wait_s
from hotload.snapshot import manifest_digest


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
    coordinated: bool = False
    """A coordinated switch (:mod:`~hotload.sidecar.switch_timing`): a build stops once
    built, a swap stages and waits for the switch time."""


#: The job each step that needs one runs as (the other steps only set the phase).
JOB_OF_STEP = {
    StepKind.SETTLE: Job.RELOAD,
    StepKind.RELOAD: Job.RELOAD,
    StepKind.SWAP: Job.BUILD,
    StepKind.BUILD: Job.BUILD,
    StepKind.CATCH_UP: Job.CATCH_UP,
}


class JobRunner:
    """Runs the steps of one agent, one job at a time (see the module docstring).

    ``memory`` reads the agent's memory as it is now, ``apply`` folds a fact into it,
    ``on_done`` is called when a job's task ends (the loop wakes), and ``waiting_for_turn``
    is entered while a build waits for its shared host's turn (:func:`build_slot`)."""

    def __init__(
        self,
        parts: AgentParts,
        memory: Callable[[], Memory],
        apply: Callable[[Fact], None],
        on_done: Callable[[], None],
        waiting_for_turn: Callable[[], contextlib.AbstractContextManager[object]] = (
            contextlib.nullcontext
        ),
    ) -> None:
        self._parts = parts
        self._memory = memory
        self._apply = apply
        self._on_done = on_done
        self._waiting_for_turn = waiting_for_turn
        self.current: RunningJob | None = None
        """The job in flight (until the loop sees it finished, or stops it)."""
        self.switch_note: tuple[Identity, SwitchPhase] | None = None
        """A coordinated switch's word for the pod: the target Staged (waiting for its
        time), or swapped OnTime or Late."""

    def start(self, step: Step) -> None:
        """Run ``step`` as the job in flight; its failure is folded when it returns. A
        build or swap waits for a coordinated switch time where the deployment asks for
        one (:func:`~hotload.sidecar.switch_timing.coordinates`)."""
        job = JOB_OF_STEP[step.kind]
        # A reload works for whatever the target is now; the other jobs for the step's.
        target = self._parts.target() if job is Job.RELOAD else step.target
        coordinated = step.kind in (StepKind.BUILD, StepKind.SWAP) and coordinates(
            self._parts.deployment, step.target, self._memory().serving
        )
        running = RunningJob(job, target, CancelToken(), coordinated=coordinated)
        self.current = running
        running.task = asyncio.get_running_loop().create_task(
            self._job(step, running), name=f"job {job.value}"
        )
        running.task.add_done_callback(lambda _: self._on_done())

    async def gives_way(self, target: SnapshotRef | None) -> bool:
        """Whether the loop may choose a step for ``target`` now: no job in flight, or one
        :func:`~hotload.sidecar.planning.should_preempt` cancels (stopped here, so staging
        has one owner again); False while the job in flight goes on."""
        job = self.current
        if job is None:
            return True
        if not should_preempt(job.job, job.target, target, engine_lost=job.engine_lost):
            return False
        log.info(
            "preempting the job in flight",
            extra={
                **self._parts.context(),
                "job": job.job.value,
                "working_on": job.target.identity if job.target else None,
                "target": target.identity if target else None,
                "engine_lost": job.engine_lost,
            },
        )
        await self.stop()
        return True

    def reap(self) -> None:
        """Forget the job in flight once its task ended."""
        job = self.current
        if job is not None and job.task is not None and job.task.done():
            self.current = None

    async def stop(self) -> None:
        """Cancel the job in flight and wait until none of its threads runs."""
        job = self.current
        if job is None or job.task is None:
            return
        job.token.cancel()
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job.task
        self.current = None
        await self.refresh()

    async def _job(self, step: Step, running: RunningJob) -> None:
        try:
            failed = await self.run(step, running)
            if failed is not None:
                self._apply(failed)
        finally:
            self._parts.fence.release()
            await self.refresh()

    async def run(self, step: Step, running: RunningJob) -> Failed | None:
        """Carry out ``step``; None when done (or stopped), else the failure to fold."""
        try:
            if step.kind in (StepKind.SETTLE, StepKind.RELOAD):
                assert step.slot is not None
                await self._reload(step.slot, step.kind, running)
            elif step.kind is StepKind.SWAP and running.coordinated:
                assert step.slot is not None and step.target is not None
                await self._staged_swap(step.slot, step.target, running)
            elif step.kind is StepKind.SWAP:
                assert step.slot is not None and step.target is not None
                await self._swap_built(step.slot, step.target, running)
            elif step.kind is StepKind.BUILD:
                assert step.slot is not None and step.target is not None
                # At once in a pod; by turns in a shared host.
                async with build_slot(self._waiting_for_turn()):
                    await self._build_and_swap(step.slot, step.target, running)
            elif step.kind is StepKind.CATCH_UP:
                assert step.slot is not None and step.target is not None
                async with build_slot(self._waiting_for_turn()):
                    await self._catch_up(step.slot, step.target, running)
        except asyncio.CancelledError:
            log.info("job cancelled", extra={**self._parts.context(), "job": running.job.value})
            raise
        except Cancelled:
            # A thread stopped at its next chunk because the job was preempted: no failure.
            log.info(
                "job stopped at a chunk", extra={**self._parts.context(), "job": running.job.value}
            )
        except (BuildFailed, HandoverFailed, HotloadError, Exception) as err:
            return await self._failed(running, err)
        return None

    async def refresh(self) -> None:
        """Read both buffers back from staging into the memory."""
        self._apply(BuffersRead(await asyncio.to_thread(self._parts.staging.buffers)))

    # --- bringing a target ----------------------------------------------------------------

    async def _build_and_swap(self, into: Slot, target: SnapshotRef, running: RunningJob) -> None:
        parts = self._parts
        deployment = parts.require_deployment()
        loader = parts.ensure_loader(deployment)
        manifests_before = loader.manifest_bytes
        memory = self._memory()
        parts.status.phase = Phase.PLANNING
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
        engine = parts.ensure_engine(deployment)
        applier = None if running.coordinated else patches_in_place(engine)
        if applier is not None and await self._route(loader, target) is Route.IN_ENGINE:
            if await self._apply_in_engine(
                applier, loader, target, timings, started, manifests_before, running
            ):
                return
            # Refused: the old weights serve on; build and load the directory instead.
            timings = LoadTimings()
        choice = choose_build(options, fresh=self._memory().fresh)
        base = (served_slot, served) if served_slot is not None and served is not None else None
        built = await loader.build(target, choice, into, base, timings, running.token)
        # Manifests count as bytes moved when this attempt read them from the bucket.
        timings.fetched_bytes += loader.manifest_bytes - manifests_before
        await self.refresh()
        if running.coordinated:
            return  # built: the next step stages it and waits for the switch time
        await self._hand(into, built.staged, target, built.via, timings, started, running)

    async def _route(self, loader: SnapshotLoader, target: SnapshotRef) -> Route:
        """The planner's route for ``target``, from the plan out of what the engine serves
        (a plan that cannot be made — a chain the engine's snapshot is not on — is no
        one-delta step: the directory load)."""
        memory = self._memory()
        serving = memory.serving
        plan = None
        if serving is not None and not memory.fresh:
            try:
                plan = await loader.plan(serving.identity, target)
            except HotloadError as err:
                log.info(
                    "no plan from the engine's snapshot; loading a directory",
                    extra={
                        **self._parts.context(),
                        "serving": serving.identity,
                        "error": str(err),
                    },
                )
        memory = self._memory()
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
        running: RunningJob,
    ) -> bool:
        """Fetch and verify the target's delta and hand it to the engine's in-place patch.
        True once the engine's report confirms the target (identity and digest); False
        when it refused and serves its old weights (recorded: this target then loads
        as a directory)."""
        parts = self._parts
        deployment = parts.require_deployment()
        manifest = await loader.manifest(target.identity)
        await loader.fetch_verified([manifest], timings, running.token)
        timings.fetched_bytes += loader.manifest_bytes - manifests_before
        staged = Staged(manifest.identity, manifest.step, manifest.kind, manifest_digest(manifest))
        transition = deployment.spec.hot_load.transition
        if running.job is Job.BUILD:
            running.job = Job.DRAIN
            parts.status.phase = Phase.DRAINING if transition is Transition.SYNC else Phase.SWAPPING

        def swapping() -> None:
            running.job = Job.SWAP
            parts.fence.begin()
            parts.status.phase = Phase.SWAPPING

        try:
            with timings.phase("swap", parts.metrics):
                report = await self._handover(parts.ensure_engine(deployment)).apply_delta(
                    engine,
                    staged,
                    transition=transition,
                    cache_policy=target.kv_cache_policy,
                    on_swapping=swapping,
                )
        except PatchRefused as refused:
            self._apply(Refused(target))
            running.job = Job.BUILD
            log.info(
                "the engine did not patch the delta in place; loading the rebuilt directory",
                extra={
                    **parts.context(),
                    "snapshot": target.identity,
                    "reason": refused.error.reason,
                    "error": str(refused.error),
                },
            )
            return False
        finally:
            parts.fence.end()
        self._apply(
            Swapped(
                staged,
                LoadPath.DELTA,
                None,
                report.instance_id,
                target,
                generation=report.generation,
                digest_confirmed=confirms_digest(report.digest, staged.digest),
            )
        )
        parts.record_swap(staged, LoadPath.DELTA, timings, started, in_engine=True)
        return True

    async def _catch_up(self, into: Slot, target: SnapshotRef, running: RunningJob) -> None:
        """Build the snapshot the engine already serves into the free buffer and make that
        the served buffer (no load): a restarted engine then reloads what it served."""
        parts = self._parts
        deployment = parts.require_deployment()
        loader = parts.ensure_loader(deployment)
        memory = self._memory()
        served_slot = memory.buffers.served
        served = memory.buffers.held(served_slot)
        free = memory.buffers.held(into)
        fresh = memory.fresh
        parts.status.phase = Phase.PLANNING
        if fresh:
            await self._forget_chain(loader, target)
        if free is not None and same_snapshot(free, target) and not fresh:
            await run_cancellable(running.token, parts.staging.verify, into, free)
            staged = free
        else:
            try:
                options = await loader.options(target, free, served)
            except HotloadError as err:
                raise BuildFailed(err, snapshot_at_fault(err, target.identity)) from err
            base = (served_slot, served) if served_slot is not None and served else None
            choice = choose_build(options, fresh=fresh)
            built = await loader.build(target, choice, into, base, LoadTimings(), running.token)
            staged = built.staged
        # The engine's word, as for a swap: the rebuild must be what it serves.
        report = await parts.ensure_engine(deployment).report(digest=True)
        serving = self._memory().serving
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
        await self.refresh()
        await run_in_thread(parts.staging.set_roles, into, self._memory().buffers.handed)
        self._apply(CaughtUp(into))
        if fresh and served_slot not in (None, into):
            # A fresh replay healed a local corruption: the older served buffer was never
            # re-verified, so it is no base for the next build.
            assert served_slot is not None
            await run_in_thread(parts.staging.clear_slot, served_slot)
            await self.refresh()
        await run_in_thread(parts.staging.clean_fetches, {staged.identity})
        parts.status.phase = Phase.IDLE
        log.info(
            "staging caught up with the served snapshot",
            extra={**parts.context(), "snapshot": staged.identity, "buffer": into.value},
        )

    async def _swap_built(self, slot: Slot, target: SnapshotRef, running: RunningJob) -> None:
        """Hand over a target built earlier (its swap was refused busy): re-hashed first,
        since its files sat in staging meanwhile; a changed file means a fresh build."""
        staged = await self._verified(slot, running)
        if staged is not None:
            await self._hand(slot, staged, target, None, LoadTimings(), datetime.now(UTC), running)

    async def _verified(self, slot: Slot, running: RunningJob) -> Staged | None:
        """What ``slot`` holds, re-hashed (a changed file clears it: a fresh build)."""
        parts = self._parts
        staged = self._memory().buffers.held(slot)
        if staged is None:
            return None
        parts.status.phase = Phase.VERIFYING
        try:
            await run_cancellable(running.token, parts.staging.verify, slot, staged)
        except HotloadError as err:
            await run_in_thread(parts.staging.clear_slot, slot)
            raise BuildFailed(err, staged.identity) from err
        return staged

    async def _staged_swap(self, slot: Slot, target: SnapshotRef, running: RunningJob) -> None:
        """A coordinated switch: the built target verified, staged in an engine that
        stages, reported Staged; then swapped at the switch time the target carries
        (docs/operator.md, "Coordinated switch"). Until the swap begins this job is a
        build (preempted by a new target, an abort taking the target back, or an engine
        that lost its weights); a stage the engine lost is made again by the next one."""
        parts = self._parts
        staged = await self._verified(slot, running)
        if staged is None:
            return
        engine = parts.ensure_engine(parts.require_deployment())
        await engine.wait_ready(parts.config.engine_ready_timeout_s)
        stager = stages_switch(engine)
        if stager is not None and await stager.staged_identity() != staged.identity:
            path = parts.staging.engine_path(slot, staged.identity)
            await stager.stage(path, staged.identity, kind=staged.kind)
        self.switch_note = (target.identity, SwitchPhase.STAGED)
        self._on_done()  # the loop reports Staged now
        log.info("staged for a coordinated switch", extra={**parts.context(),
                 "snapshot": staged.identity, "in_engine": stager is not None})  # fmt: skip
        while True:
            current = parts.target()
            at = switch_time_of(current) if same_snapshot(current, target) else None
            now = datetime.now(UTC)
            if due(at, now, stages=stager is not None):
                break
            await asyncio.sleep(wait_s(at, now, stages=stager is not None))
        assert at is not None and current is not None
        phase = switched(at, now)
        await self._hand(slot, staged, current, None, LoadTimings(), now, running, switch_at=at)
        self.switch_note = (target.identity, phase)

    # --- reloading ------------------------------------------------------------------------

    async def _reload(self, slot: Slot, kind: StepKind, running: RunningJob) -> None:
        """Load a staged buffer again: the served one after the engine lost its weights,
        or the handed one to settle a load of unknown outcome."""
        parts = self._parts
        staged = self._memory().buffers.held(slot)
        if staged is None:
            return
        parts.status.phase = Phase.RELOADING
        why = "settle a load of unknown outcome" if kind is StepKind.SETTLE else "engine lost it"
        log.info(
            "reloading a staged snapshot into the engine",
            extra={
                **parts.context(),
                "snapshot": staged.identity,
                "buffer": slot.value,
                "why": why,
            },
        )
        try:
            await run_cancellable(running.token, parts.staging.verify, slot, staged)
        except HotloadError as err:
            if slot == self._memory().buffers.handed:
                self._apply(Unusable(slot))  # the engine may still read it: untouched
                log.warning(
                    "a handed buffer no longer verifies; it is not loaded again",
                    extra={**parts.context(), "buffer": slot.value, "error": str(err)},
                )
            else:
                await self._abandon(slot, str(err))
            await self.refresh()
            return
        if not self._still_needed(kind):
            return
        await self._hand(
            slot, staged, None, LoadPath.RELOAD, LoadTimings(), datetime.now(UTC), running
        )

    def _still_needed(self, kind: StepKind) -> bool:
        """Whether the reason for a reload or a settle still holds after the re-hash.

        The engine is observed meanwhile: the unknown load may have been confirmed as
        landed (nothing is handed any more), or what the engine serves adopted — and
        the pod may already have said Ready on it. Loading now would only take the
        engine somewhere it was not asked to go (level-triggered: the next decision
        starts from what is known then)."""
        memory = self._memory()
        if kind is StepKind.SETTLE and memory.buffers.handed is None:
            reason = "the load of unknown outcome was confirmed meanwhile"
        elif kind is StepKind.RELOAD and (
            memory.serving is not None or memory.unconfirmed is not None
        ):
            reason = "the engine serves a snapshot known (or being checked) meanwhile"
        else:
            return True
        log.info("reload not needed any more", extra={**self._parts.context(), "why": reason})
        return False

    async def _abandon(self, slot: Slot, why: str) -> None:
        """A buffer that cannot be loaded any more is no reload source (the next load
        builds from the bucket); a handed one stays untouched until the engine settles."""
        staging = self._parts.staging
        buffers = await asyncio.to_thread(staging.buffers)
        served = None if buffers.served == slot else buffers.served
        handed = None if buffers.handed == slot else buffers.handed
        await run_in_thread(staging.set_roles, served, handed)
        if slot != buffers.handed:
            await run_in_thread(staging.clear_slot, slot)
        log.warning(
            "a staged snapshot is no longer usable",
            extra={**self._parts.context(), "buffer": slot.value, "error": why},
        )

    # --- the handover -----------------------------------------------------------------------

    def _handover(self, engine: Engine, *, owe_resume: bool = False) -> Handover:
        """The handover to ``engine``; with ``owe_resume``, an engine it could not resume
        is resumed later, between jobs (:meth:`resume_if_owed`)."""
        parts = self._parts
        return Handover(
            engine,
            parts.staging,
            parts.gate,
            parts.metrics,
            drain_timeout_s=parts.config.sync_drain_timeout_s,
            on_left_paused=(lambda: self._apply(ResumeOwed(True))) if owe_resume else None,
        )

    def between_loads(self) -> bool:
        """No load of ours can be under way: no job, or one still building (or catching
        up) that has not reached the engine. A resume now (of an engine someone else
        paused) cannot land inside a load of ours, which pauses only once in hand."""
        job = self.current
        if job is None:
            return True
        return job.job in (Job.BUILD, Job.CATCH_UP) and not self._parts.fence.handing

    async def resume_if_owed(self) -> None:
        """Resume an engine a handover may have left paused (its resume kept failing, or
        the sidecar was killed while it held requests), or that someone else paused: only
        :meth:`between_loads`, with the engine's weights confirmed, so no load of ours is
        under way to be resumed into (else at a later turn)."""
        parts, memory = self._parts, self._memory()
        engine = parts.engine
        if not memory.resume_owed or engine is None or memory.serving is None:
            return
        if not self.between_loads():
            return
        try:
            async with asyncio.timeout(parts.config.engine_report_timeout_s):
                await engine.resume()
        except (HotloadError, TimeoutError) as err:
            log.warning(
                "the engine did not resume; trying again",
                extra={**parts.context(), "error": str(err)},
            )
            return
        self._apply(ResumeOwed(False))

    async def _hand(
        self,
        slot: Slot,
        staged: Staged,
        target: SnapshotRef | None,
        via: LoadPath | None,
        timings: LoadTimings,
        started: datetime,
        running: RunningJob,
        *,
        switch_at: datetime | None = None,
    ) -> None:
        """Hand ``slot`` to the engine and record what it now serves (``switch_at``: a
        coordinated switch's instant, see :meth:`Handover.hand`)."""
        parts = self._parts
        deployment = parts.require_deployment()
        engine = parts.ensure_engine(deployment)
        transition = deployment.spec.hot_load.transition
        if running.job is Job.BUILD:
            running.job = Job.DRAIN
            parts.status.phase = Phase.DRAINING if transition is Transition.SYNC else Phase.SWAPPING

        already = self._memory().buffers.handed == slot

        def swapping() -> None:
            running.handed, running.already_handed = slot, already
            if running.job is Job.DRAIN:
                running.job = Job.SWAP
            parts.fence.begin()
            parts.status.phase = Phase.RELOADING if via is LoadPath.RELOAD else Phase.SWAPPING

        final_via = via or LoadPath.DELTA
        served_slot = self._memory().buffers.served

        def confirmed(report: EngineReport) -> None:
            # Before held requests resume: the front labels their tokens with this.
            self._apply(
                Served(
                    staged, final_via, slot, report.instance_id, report.generation,
                    confirms_digest(report.digest, staged.digest),
                )
            )  # fmt: skip

        await engine.wait_ready(parts.config.engine_ready_timeout_s)
        handover = self._handover(engine, owe_resume=True)
        with timings.phase("swap", parts.metrics):
            report = await handover.hand(
                slot,
                staged,
                served=served_slot,
                transition=transition,
                cache_policy=target.kv_cache_policy if target is not None else None,
                on_swapping=swapping,
                recovery=self._memory().buffers.held(served_slot) if served_slot else None,
                on_confirmed=confirmed,
                switch_at=switch_at,
            )
        parts.fence.end()
        if switch_at is not None:
            took = handover.switched_at
            log.info("coordinated switch", extra={**parts.context(), "snapshot": staged.identity,
                     "switch_at": switch_at.isoformat(), "engine_switched_at":
                     took.isoformat() if took else None})  # fmt: skip
        memory = self._memory()
        previous = memory.buffers.served
        clear_previous = memory.fresh and target is not None and previous not in (None, slot)
        self._apply(
            Swapped(
                staged, final_via, slot, report.instance_id, target, generation=report.generation,
                digest_confirmed=confirms_digest(report.digest, staged.digest),
            )
        )  # fmt: skip
        if clear_previous:
            # A fresh replay healed a local corruption: the buffer served until now was
            # never re-verified, so it is no base for the next build.
            assert previous is not None
            await run_in_thread(parts.staging.clear_slot, previous)
            await self.refresh()
        parts.record_swap(staged, final_via, timings, started)
        # The served snapshot's own download stays: the free buffer, one step behind,
        # is patched through it next time.
        await run_in_thread(parts.staging.clean_fetches, {staged.identity})

    async def _forget_chain(self, loader: SnapshotLoader, target: SnapshotRef) -> None:
        """Before a fresh replay: read the chain's manifests and files from the bucket
        again (what staging holds may be what was bad)."""
        loader.forget_manifests({target.identity})
        plan = await loader.plan(None, target)
        chain = set(plan.apply) | {target.identity}
        loader.forget_manifests(chain)
        await run_in_thread(self._parts.staging.drop_fetched, chain)
        log.info(
            "replaying from the last Full, every file fetched again",
            extra={**self._parts.context(), "snapshot": target.identity, "chain": sorted(chain)},
        )

    # --- failures -------------------------------------------------------------------------

    async def _failed(self, running: RunningJob, err: BaseException) -> Failed:
        """The planner's decision on a failure; its I/O done here, the rest returned."""
        decision, message, snapshot = self._decide(running, err)
        await self._settle(decision, running, message)
        parts, target = self._parts, running.target
        retry_at = None
        if decision.action is Action.RETRY:
            retry_at = asyncio.get_running_loop().time() + parts.delay(decision.backoff_attempt)
        elif decision.action is Action.GIVE_UP:
            log.warning(
                "staging does not hold the served snapshot; a restarted engine reloads "
                "the older served buffer",
                extra={**parts.context(), "snapshot": target.identity if target else None},
            )
        elif decision.action is Action.FAIL and target is not None:
            now = datetime.now(UTC)
            parts.status.history.append(
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
        return Failed(decision, target, message, snapshot, retry_at)

    def _decide(
        self, running: RunningJob, err: BaseException
    ) -> tuple[FailureDecision, str, Identity | None]:
        """The planner's :func:`after_failure` on ``err``: the decision, the message, and
        the snapshot at fault; recorded in the metrics, ``/status`` and the log."""
        parts = self._parts
        memory = self._memory()
        error: BaseException = err
        snapshot = running.target.identity if running.target else None
        outcome_known = True
        intact = False
        if isinstance(err, BuildFailed):
            error, snapshot = err.error, err.snapshot
        elif isinstance(err, HandoverFailed):
            error, outcome_known, intact = err.error, err.outcome_known, err.weights_intact
        expected = isinstance(error, HotloadError)
        reason = error.reason if isinstance(error, HotloadError) else INTERNAL_ERROR
        message = str(error) if expected else f"{type(error).__name__}: {error}"
        if not expected:
            log.error(
                "job failed unexpectedly",
                exc_info=error,
                extra={**parts.context(), "job": running.job.value},
            )
        engine = parts.engine
        failure = Failure(
            reason, running.job, expected=expected, fresh=memory.fresh, outcome_known=outcome_known
        )
        decision = after_failure(
            failure,
            memory.attempts,
            rollback_trusted=intact or (engine.rollback_trusted if engine is not None else True),
            unexpected_cap=parts.config.unexpected_failure_cap,
        )
        parts.metrics.failures.labels(reason=decision.reason).inc()
        target = running.target
        parts.status.last_error = ErrorRecord(
            reason=decision.reason,
            message=message,
            transient=decision.action is not Action.FAIL,
            target=target.identity if target else None,
            at=datetime.now(UTC),
        )
        log.warning(
            "job failed",
            extra={
                **parts.context(),
                "job": running.job.value,
                "reason": decision.reason,
                "action": decision.action.value,
                "error": message,
                "snapshot": snapshot,
            },
        )
        return decision, message, snapshot

    async def _settle(self, decision: FailureDecision, running: RunningJob, message: str) -> None:
        """What a failure means for the engine and staging, done at once."""
        parts = self._parts
        if decision.weights_unknown:
            self._apply(WeightsLost())
        buffers = await asyncio.to_thread(parts.staging.buffers)
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
            await run_in_thread(parts.staging.set_roles, buffers.served, None)
        await self.refresh()
