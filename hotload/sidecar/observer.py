"""The engine's word: what its report means for what the pod may say, as a value.

On every turn of the loop :meth:`EngineObserver.observe` asks the engine what it serves
and lets the planner's :func:`~hotload.sidecar.planning.judge_engine` say what that
means; it returns an :class:`~hotload.sidecar.memory.Observation` that the loop folds
into the agent's memory. It changes no memory itself. What it may touch: the engine's
report, the bucket's manifests (read only, through the loader), and staging's record of
which buffer is served once the engine confirmed one.

- The engine serves what the pod says: nothing to change.
- It restarted, or names another snapshot than the pod says (same instance: a delta
  patched in place whose answer was lost, a load by someone else): the observation says
  ``lost`` (the pod drops its snapshot at once) and ``again``: the loop looks once more
  as a restarted sidecar would, so a newer snapshot the engine verifiably serves is
  adopted rather than overwritten by a reload of the older served buffer.
- A load of unknown outcome landed, or (after a sidecar restart) the engine serves a
  staged snapshot: that buffer becomes the served one.
- It names a snapshot no buffer holds: trusted once its manifest (and the digest, where
  the engine gives one) confirms it; while that check cannot conclude (the bucket does
  not answer) the observation names it ``unconfirmed`` and the planner loads nothing
  over it.
- Same instance, same name, but its generation moved (a load we did not send, under the
  name it serves): re-verified at once by the engine's digest. The same weights: kept,
  at the new generation. Other weights, or no digest to tell: ``lost`` (an engine
  without a digest also ``unverified``: its label proves nothing), so the served buffer
  is reloaded and the pod says nothing it cannot prove meanwhile.
- It holds generation (paused) outside any handover of ours: ``paused``, and the loop
  resumes it. Both are the replica's ``lastError`` (``ForeignLoad``, ``EnginePaused``).

An answer taken while a handover began or ended is stale: ``observe`` returns None.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from hotload.api import LoadPath
from hotload.api.kinds import Identity
from hotload.api.pod import ANNOTATION_SNAPSHOT, ANNOTATION_VIA
from hotload.api.reasons import ENGINE_PAUSED, FOREIGN_LOAD
from hotload.cancellation import run_in_thread
from hotload.engines.protocol import Engine, EngineReport
from hotload.errors import HotloadError, NotFound
from hotload.sidecar.memory import Memory, Observation
from hotload.sidecar.parts import AgentParts, log
from hotload.sidecar.planning import (
    EngineJudgement,
    Serving,
    Slot,
    Staged,
    Verdict,
    confirms_digest,
    foreign_load_verified,
    judge_engine,
)
from hotload.sidecar.status import EngineSeen, ErrorRecord
from hotload.snapshot import manifest_digest


class EngineObserver:
    """Looks at the engine for one agent. ``memory`` reads the agent's memory as it is
    now; ``observed`` the pod's report as the sidecar found it at start."""

    def __init__(
        self,
        parts: AgentParts,
        memory: Callable[[], Memory],
        observed: Callable[[], dict[str, str]],
    ) -> None:
        self._parts = parts
        self._memory = memory
        self._observed = observed

    async def observe(self) -> Observation | None:
        """One look at the engine (None: no engine yet, or the answer is stale)."""
        parts = self._parts
        engine = parts.engine
        if engine is None or parts.fence.handing:
            return None
        epoch = parts.fence.epoch
        report = await self._report(engine, digest=False)
        serving = self._memory().serving
        named = report.identity if report is not None else None
        if named is not None and (serving is None or serving.identity != named):
            report = await self._report(engine, digest=True)
        if parts.fence.moved(epoch):
            return None  # a handover started or ended meanwhile: this answer is stale
        memory = self._memory()
        serving = memory.serving
        seen = EngineSeen(
            identity=report.identity if report else None,
            instance_id=report.instance_id if report else None,
            answered=report is not None,
            at=datetime.now(UTC),
        )
        judgement = judge_engine(
            serving, report, memory.buffers, weights_unknown=memory.weights_unknown
        )
        verdict = judgement.verdict
        answers = verdict is not Verdict.UNREACHABLE
        if report is None:
            return Observation(seen, answers)
        if report.paused:
            self._record(ENGINE_PAUSED, "the engine was paused outside a swap; resuming it")
            log.warning("the engine is paused outside a swap; resuming it", extra=parts.context())
        observation = await self._judged(seen, report, judgement, epoch)
        if observation is not None and report.paused:
            observation = replace(observation, paused=True)
        return observation

    async def _judged(
        self, seen: EngineSeen, report: EngineReport, judgement: EngineJudgement, epoch: int
    ) -> Observation | None:
        """What the verdict on ``report`` means (None: stale, a handover moved)."""
        parts, serving = self._parts, self._memory().serving
        verdict, answers = judgement.verdict, True
        if verdict is Verdict.FOREIGN_LOAD and serving is not None:
            return await self._reverify(seen, serving, judgement.detail, epoch)
        if verdict is Verdict.LOST:
            log.warning(
                "the engine does not serve what the pod says",
                extra={**parts.context(), "detail": judgement.detail},
            )
            return Observation(seen, answers, lost=True, again=True)
        if verdict in (Verdict.LANDED, Verdict.ADOPT) and judgement.slot is not None:
            return await self._confirm(seen, judgement.slot, report, judgement.identity)
        if verdict is Verdict.ADOPT_UNSTAGED:
            return await self._adopt_unstaged(seen, report, epoch)
        return Observation(seen, answers, lost=verdict is Verdict.EMPTY and serving is not None)

    async def _reverify(
        self, seen: EngineSeen, serving: Serving, detail: str, epoch: int
    ) -> Observation | None:
        """A load we did not send: the engine's digest says whether it still serves the
        weights we verified (kept, at its new generation) or not (``lost``; reloaded)."""
        parts = self._parts
        engine = parts.engine
        report = await self._report(engine, digest=True) if engine is not None else None
        if parts.fence.moved(epoch):
            return None
        if report is None:
            return Observation(seen, False)
        if foreign_load_verified(serving, report):
            self._record(FOREIGN_LOAD, f"{detail}; its digest is still {serving.identity}'s")
            log.warning(
                "the engine took a load we did not send; its weights are still ours",
                extra={**parts.context(), "detail": detail, "snapshot": serving.identity},
            )
            return Observation(seen, True, regenerated=report.generation)
        unverified = report.digest is None
        why = "it offers no digest to tell" if unverified else "its digest differs"
        self._record(FOREIGN_LOAD, f"{detail}; {why}: reloading the last verified snapshot")
        log.warning(
            "the engine took a load we did not send; reloading the last verified snapshot",
            extra={**parts.context(), "detail": detail, "snapshot": serving.identity},
        )
        return Observation(seen, True, lost=True, again=True, unverified=unverified)

    def _record(self, reason: str, message: str) -> None:
        """What happened to the engine, as the replica's ``lastError`` (and counted)."""
        parts = self._parts
        target = parts.target()
        parts.metrics.failures.labels(reason=reason).inc()
        parts.status.last_error = ErrorRecord(
            reason=reason,
            message=message,
            transient=True,
            target=target.identity if target else None,
            at=datetime.now(UTC),
        )

    async def _report(self, engine: Engine, *, digest: bool) -> EngineReport | None:
        try:
            async with asyncio.timeout(self._parts.config.engine_report_timeout_s):
                return await engine.report(digest=digest)
        except (HotloadError, TimeoutError) as err:
            log.info(
                "the engine did not answer", extra={**self._parts.context(), "error": str(err)}
            )
            return None

    async def _confirm(
        self,
        seen: EngineSeen,
        slot: Slot,
        report: EngineReport,
        identity: Identity | None,
    ) -> Observation:
        """The engine serves the verified rebuild in ``slot``: that buffer is the served one."""
        buffers = self._memory().buffers
        staged = buffers.held(slot)
        if staged is None:
            return Observation(seen, True)
        engine = self._parts.engine
        if report.digest is None and engine is not None:
            # The pod reports the digest it verified: ask for it (a mismatch leaves none).
            again = await self._report(engine, digest=True)
            if again is not None and again.identity == report.identity:
                report = again
        # A buffer handed with its outcome unknown stays handed (the engine may still be
        # reading it) unless it is the one now confirmed.
        handed = None if buffers.handed == slot else buffers.handed
        await run_in_thread(self._parts.staging.set_roles, slot, handed)
        log.info(
            "the engine serves a staged snapshot",
            extra={**self._parts.context(), "snapshot": staged.identity, "buffer": slot.value},
        )
        served = Serving(
            staged.identity,
            staged.step,
            staged.kind,
            self._via(identity),
            slot,
            report.instance_id,
            digest=staged.digest,
            generation=report.generation,
            digest_confirmed=confirms_digest(report.digest, staged.digest),
        )
        return Observation(seen, True, served=served, roles=(slot, handed))

    async def _adopt_unstaged(
        self, seen: EngineSeen, report: EngineReport, epoch: int
    ) -> Observation:
        """The engine names a snapshot no buffer holds: trust it once its manifest (and
        the digest, where the engine gives one) confirms it.

        Concluded — adopted, or refuted (no such manifest, another digest: the served
        buffer may then be reloaded over it) — or pending: no deployment yet, the bucket
        did not answer (``unconfirmed``: nothing is loaded over it), or a load began or
        ended meanwhile, which makes this report stale (``unconfirmed`` too)."""
        parts = self._parts
        identity = report.identity
        key = (identity or "", report.instance_id)
        deployment = parts.deployment
        if identity is None or key in self._memory().unstaged_checked:
            return Observation(seen, True)
        if deployment is None:
            return Observation(seen, True, unconfirmed=identity)
        try:
            manifest = await parts.ensure_loader(deployment).manifest(identity)
        except HotloadError as err:
            concluded = isinstance(err, NotFound) or not err.transient
            log.info(
                "the engine serves a snapshot this replica cannot confirm",
                extra={
                    **parts.context(),
                    "snapshot": identity,
                    "error": str(err),
                    "retried": not concluded,
                },
            )
            if concluded:
                return Observation(seen, True, checked=key)
            return Observation(seen, True, unconfirmed=identity)
        if parts.fence.moved(epoch):
            return Observation(seen, True, unconfirmed=identity)
        if report.digest is not None and report.digest != manifest_digest(manifest):
            log.warning(
                "the engine's weights are not the snapshot it names",
                extra={**parts.context(), "snapshot": identity},
            )
            return Observation(seen, True, checked=key)
        staged = Staged(identity, manifest.step, manifest.kind, manifest_digest(manifest))
        log.info(
            "the engine serves a snapshot confirmed by its manifest; adopted",
            extra={**parts.context(), "snapshot": identity},
        )
        served = Serving(
            staged.identity,
            staged.step,
            staged.kind,
            self._via(identity),
            None,
            report.instance_id,
            digest=staged.digest,
            generation=report.generation,
            digest_confirmed=confirms_digest(report.digest, staged.digest),
        )
        return Observation(seen, True, served=served)

    def _via(self, identity: Identity | None) -> LoadPath | None:
        """How the pod said it got ``identity``, when a restarted sidecar adopts it."""
        observed = self._observed()
        if identity is not None and observed.get(ANNOTATION_SNAPSHOT) == identity:
            with contextlib.suppress(ValueError):
                return LoadPath(observed.get(ANNOTATION_VIA, ""))
        return None
