"""The agent's jobs: bring a target to the engine, reload, settle, catch staging up.

Each job runs as one asyncio task (:meth:`LoadJobs._run_job`); what it does was decided
by the planner (:mod:`hotload.sidecar.planning`): patch a one-delta step into an engine
that patches in place (falling back to the directory on a refusal), build the target
into the free buffer and hand it over, hand over a buffer built earlier, reload the
served buffer or settle a load of unknown outcome, or catch staging up with what the
engine serves. A failure goes through :func:`~hotload.sidecar.planning.after_failure`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from hotload.api import LoadPath, ReplicaState, SnapshotRef, Transition
from hotload.api.reasons import INTERNAL_ERROR
from hotload.cancellation import Cancelled, run_cancellable, run_in_thread
from hotload.engines.capabilities import PatchesInPlace, patches_in_place
from hotload.engines.protocol import EngineReport
from hotload.errors import DigestMismatch, HotloadError
from hotload.sidecar.agent_core import AgentCore, Retry, RunningJob, log
from hotload.sidecar.handover import Handover, HandoverFailed, PatchRefused
from hotload.sidecar.loader import BuildFailed, LoadTimings, SnapshotLoader, snapshot_at_fault
from hotload.sidecar.planning import (
    Action,
    Attempts,
    Failure,
    FailureDecision,
    Hold,
    Job,
    Route,
    Slot,
    Staged,
    StepKind,
    after_failure,
    choose_build,
    choose_route,
    same_snapshot,
)
from hotload.sidecar.status import ErrorRecord, Phase, SwapRecord
from hotload.snapshot import manifest_digest

if TYPE_CHECKING:
    from collections.abc import Awaitable


class LoadJobs(AgentCore):
    """Runs the one job in flight, and handles its failure."""

    async def _run_job(self, running: RunningJob, body: Awaitable[None]) -> None:
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
        if not self._still_needed(kind):
            return
        await self._hand(slot, staged, None, LoadPath.RELOAD, LoadTimings(), datetime.now(UTC))

    def _still_needed(self, kind: StepKind) -> bool:
        """Whether the reason for a reload or a settle still holds after the re-hash.

        The engine is observed meanwhile: the unknown load may have been confirmed as
        landed (nothing is handed any more), or what the engine serves adopted — and
        the pod may already have said Ready on it. Loading now would only take the
        engine somewhere it was not asked to go (level-triggered: the next decision
        starts from what is known then)."""
        memory = self._memory
        if kind is StepKind.SETTLE and memory.buffers.handed is None:
            reason = "the load of unknown outcome was confirmed meanwhile"
        elif kind is StepKind.RELOAD and (
            memory.serving is not None or memory.unconfirmed is not None
        ):
            reason = "the engine serves a snapshot known (or being checked) meanwhile"
        else:
            return True
        log.info("reload not needed any more", extra={**self._context(), "why": reason})
        return False

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
            on_left_paused=self._owe_resume,
        )
        final_via = via or LoadPath.DELTA
        served_slot = self._memory.buffers.served

        def confirmed(report: EngineReport) -> None:
            # Before held requests resume: the front labels their tokens with this.
            self._set_serving(staged, final_via, slot, report.instance_id)

        with timings.phase("swap", self._metrics):
            report = await handover.hand(
                slot,
                staged,
                served=served_slot,
                transition=transition,
                cache_policy=target.kv_cache_policy if target is not None else None,
                on_swapping=swapping,
                recovery=self._memory.buffers.held(served_slot) if served_slot else None,
                on_confirmed=confirmed,
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

    def _owe_resume(self) -> None:
        """The handover could not resume the engine: resume it later, between jobs."""
        self._memory.resume_owed = True

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

    async def _failed(self, running: RunningJob, err: BaseException) -> None:
        memory = self._memory
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
                extra={**self._context(), "job": running.job.value},
            )
        engine = self._engine
        failure = Failure(
            reason, running.job, expected=expected, fresh=memory.fresh, outcome_known=outcome_known
        )
        decision = after_failure(
            failure,
            memory.attempts,
            rollback_trusted=intact or (engine.rollback_trusted if engine is not None else True),
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
        running: RunningJob,
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
            memory.retry = Retry(target, asyncio.get_running_loop().time() + delay)
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
