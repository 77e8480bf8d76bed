"""The engine's word: what its report means for what the pod may say.

On every reconcile the agent asks the engine what it serves; the planner's
:func:`~hotload.sidecar.planning.judge_engine` says what that means, and this mixin
applies it — dropping the pod's snapshot at once when the engine restarted or serves
something else, confirming a load of unknown outcome that landed, adopting what a
restarted sidecar finds the engine serving (checked against its manifest and digest).

When the engine names another snapshot than the pod says (same instance: a delta
patched in place whose answer was lost, a load by someone else), the pod drops its
snapshot at once and the report is judged again as a restarted sidecar would judge it:
a newer snapshot the engine verifiably serves is adopted, never overwritten by a reload
of the older served buffer. While that check cannot conclude (the bucket does not
answer), :attr:`Memory.unconfirmed` names it and the planner loads nothing over it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from datetime import UTC, datetime

from hotload.api import LoadPath
from hotload.api.kinds import Identity
from hotload.api.pod import ANNOTATION_SNAPSHOT, ANNOTATION_VIA
from hotload.cancellation import run_in_thread
from hotload.engines.protocol import Engine, EngineReport
from hotload.errors import HotloadError, NotFound
from hotload.sidecar.agent_core import AgentCore, log
from hotload.sidecar.planning import Slot, Staged, Verdict, judge_engine
from hotload.sidecar.status import EngineSeen
from hotload.snapshot import manifest_digest


class EngineWatch(AgentCore):
    """Observes the engine and brings what the pod says in line with it."""

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
        memory.unconfirmed = None
        if verdict is Verdict.LOST and report is not None:
            log.warning(
                "the engine does not serve what the pod says",
                extra={**self._context(), "detail": judgement.detail},
            )
            self._lose_serving()
            # What does it serve, then? Judged as a restarted sidecar judges it (with the
            # digest), so a newer snapshot it verifiably serves is adopted rather than
            # replaced by the older served buffer.
            if report.identity is not None and report.digest is None:
                report = await self._engine_report(engine, digest=True)
                if self._handing or epoch != self._engine_epoch:
                    return
                if report is None:
                    memory.engine_answers = False
                    return
            judgement = judge_engine(
                None, report, memory.buffers, weights_unknown=memory.weights_unknown
            )
            verdict = judgement.verdict
        if (verdict is Verdict.LANDED and judgement.slot is not None and report is not None) or (
            verdict is Verdict.ADOPT and judgement.slot is not None and report is not None
        ):
            await self._confirm(judgement.slot, report, self._observed_via(judgement.identity))
        elif verdict is Verdict.ADOPT_UNSTAGED and report is not None:
            if not await self._adopt_unstaged(report, epoch):
                memory.unconfirmed = report.identity
        elif verdict is Verdict.EMPTY and memory.serving is not None:
            self._lose_serving()

    async def _resume_if_owed(self) -> None:
        """Resume an engine a handover may have left paused (its resume kept failing, or
        the sidecar was killed while it held requests): called only between jobs, with
        the engine's weights confirmed, so no load is under way to be resumed into."""
        memory, engine = self._memory, self._engine
        if not memory.resume_owed or engine is None or memory.serving is None:
            return
        try:
            async with asyncio.timeout(self.config.engine_report_timeout_s):
                await engine.resume()
        except (HotloadError, TimeoutError) as err:
            log.warning(
                "the engine did not resume; trying again",
                extra={**self._context(), "error": str(err)},
            )
            return
        memory.resume_owed = False

    async def _engine_report(self, engine: Engine, *, digest: bool) -> EngineReport | None:
        try:
            async with asyncio.timeout(self.config.engine_report_timeout_s):
                return await engine.report(digest=digest)
        except (HotloadError, TimeoutError) as err:
            log.info("the engine did not answer", extra={**self._context(), "error": str(err)})
            return None

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

    async def _adopt_unstaged(self, report: EngineReport, epoch: int) -> bool:
        """The engine names a snapshot no buffer holds: trust it once its manifest (and
        the digest, where the engine gives one) confirms it.

        True once the check concluded — adopted, or refuted (no such manifest, another
        digest: the served buffer may then be reloaded over it). False while it is
        pending (no deployment yet, the bucket did not answer, or a load began or ended
        meanwhile, which makes this report stale): the caller loads nothing over it."""
        identity = report.identity
        key = (identity or "", report.instance_id)
        deployment = self._deployment
        if identity is None or key in self._memory.unstaged_checked:
            return True
        if deployment is None:
            return False
        try:
            manifest = await self._ensure_loader(deployment).manifest(identity)
        except HotloadError as err:
            concluded = isinstance(err, NotFound) or not err.transient
            if concluded:
                self._memory.unstaged_checked.add(key)
            log.info(
                "the engine serves a snapshot this replica cannot confirm",
                extra={
                    **self._context(),
                    "snapshot": identity,
                    "error": str(err),
                    "retried": not concluded,
                },
            )
            return concluded
        if self._handing or epoch != self._engine_epoch:
            return False  # a handover started or ended while the manifest was read
        if report.digest is not None and report.digest != manifest_digest(manifest):
            self._memory.unstaged_checked.add(key)
            log.warning(
                "the engine's weights are not the snapshot it names",
                extra={**self._context(), "snapshot": identity},
            )
            return True
        staged = Staged(identity, manifest.step, manifest.kind, manifest_digest(manifest))
        self._set_serving(staged, self._observed_via(identity), None, report.instance_id)
        log.info(
            "the engine serves a snapshot confirmed by its manifest; adopted",
            extra={**self._context(), "snapshot": identity},
        )
        return True

    def _observed_via(self, identity: Identity | None) -> LoadPath | None:
        observed = self._observed_pod.annotations if self._observed_pod else {}
        if identity is not None and observed.get(ANNOTATION_SNAPSHOT) == identity:
            with contextlib.suppress(ValueError):
                return LoadPath(observed.get(ANNOTATION_VIA, ""))
        return None
