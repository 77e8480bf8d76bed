"""Hand a verified buffer to the engine: the only step that touches traffic.

The sequence (docs/engines.md): the front's gate closes the way the transition says
(ASYNC holds new requests; SYNC refuses them with 425 and drains in-flight ones, up to a
limit); ``buffers.json`` records the buffer as *handed* (fsync'd) before the engine sees
its path; the engine loads (ASYNC: paused in place around it); the engine's own report
confirms what it now serves — identity, and the weights' digest where it offers one —
and only then is the buffer recorded as *served* and the previous one freed.

An engine that swaps between tokens (:mod:`hotload.engines.capabilities`) is neither
paused nor gated around an ASYNC load: it reads and checks the directory while serving
and swaps between two tokens with the cache policy applied in the same step, so the only
pause is its own swap. The same holds for a delta patched in place
(:meth:`Handover.apply_delta`): only the delta's directory (as fetched and verified) is
handed; a refusal (``DeltaNotApplicable``, ``EngineRejected``) leaves the old weights
serving and is :class:`PatchRefused`, for the caller to load the rebuilt directory.

An ASYNC load that changes the LoRA adapter of an engine binding each request to one
(:class:`~hotload.engines.capabilities.BindsAdapterPerRequest`: SGLang, vLLM) is not
paused in place: a held request would resume on the adapter (or base weights) it was
admitted to, under the new identity. The gate holds new requests and lets those in
flight finish first (up to the drain timeout, as SYNC), then the engine loads.

A load that fails in an engine without rollback (``rollback_trusted`` False: SGLang,
vLLM) is followed, while requests are still held, by a reload of the served buffer; the
held requests resume only after the engine confirmed it (or that reload failed too), so
none runs on weights left half-loaded — a vLLM in that state dies on its next request.
The confirmation of a load also comes before the resume, so tokens of the new weights
are never labelled with the old identity by an engine that names none per response.

A failure says whether the engine answered (:attr:`HandoverFailed.outcome_known`): an
explicit refusal or "busy" means it did not take the load; a timeout, a lost connection
or a server error means it may have, or may still be loading — that buffer then stays
handed, untouched, until a settling load tells.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from hotload.api import KvCachePolicy, SnapshotKind, Transition
from hotload.api.kinds import Identity
from hotload.cancellation import run_in_thread
from hotload.engines.capabilities import (
    PatchesInPlace,
    binds_adapter_per_request,
    stages_switch,
    swaps_between_tokens,
)
from hotload.engines.protocol import Engine, EngineReport, PauseMode
from hotload.errors import (
    DeltaNotApplicable,
    DigestMismatch,
    EngineBusy,
    EngineRejected,
    HotloadError,
    LoadNotStarted,
)
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import Slot, Staged
from hotload.sidecar.staging import StagingArea
from hotload.sidecar.swap_gate import SwapGate

log = logging.getLogger(__name__)

#: How long a failing resume is retried: an engine left paused holds every request.
RESUME_RETRY_S = 30.0
#: Reloads of the served buffer after a failed load: vLLM 0.32.0 refuses the first
#: reload after a refused one (its layer-wise reload state is left half-done) and takes
#: the next (docs/engines.md, "A real vLLM here").
RECOVERY_ATTEMPTS = 2


class HandoverFailed(Exception):
    """The handover failed; ``outcome_known`` says whether the engine took no load;
    ``weights_intact`` that it serves what it served before (the engine never touched
    its weights, or the served buffer was reloaded and confirmed before any request
    ran), whatever its ``rollback_trusted`` says."""

    def __init__(
        self, error: BaseException, *, outcome_known: bool, weights_intact: bool = False
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.outcome_known = outcome_known
        self.weights_intact = weights_intact


class PatchRefused(Exception):
    """The engine did not patch the delta in place and serves its old weights on."""

    def __init__(self, error: HotloadError) -> None:
        super().__init__(str(error))
        self.error = error


class Handover:
    """Hands buffers of one staging area to one engine, behind one swap gate."""

    def __init__(
        self,
        engine: Engine,
        staging: StagingArea,
        gate: SwapGate,
        metrics: AgentMetrics,
        *,
        drain_timeout_s: float,
        on_left_paused: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.staging = staging
        self.gate = gate
        self.metrics = metrics
        self.drain_timeout_s = drain_timeout_s
        self.switched_at: datetime | None = None
        """After a staged switch: the instant the engine says it took effect."""
        self.on_left_paused = on_left_paused
        """Called when the engine did not resume within :data:`RESUME_RETRY_S` (the agent
        resumes it later, between jobs)."""

    async def hand(
        self,
        slot: Slot,
        staged: Staged,
        *,
        served: Slot | None,
        transition: Transition,
        cache_policy: KvCachePolicy | None,
        on_swapping: Callable[[], None],
        recovery: Staged | None = None,
        on_confirmed: Callable[[EngineReport], None] | None = None,
        switch_at: datetime | None = None,
    ) -> EngineReport:
        """Load ``staged`` from ``slot`` into the engine; the engine's report afterwards.

        ``switch_at``: a coordinated switch's instant. An engine that stages
        (:class:`~hotload.engines.capabilities.StagesSwitch`, its stage made beforehand)
        swaps between two tokens at that instant by its own clock, whatever the transition
        (:attr:`switched_at` then holds the instant it says it took effect); another engine
        is loaded as always (the caller starts it at the instant).

        ``served`` is the buffer served until now (its role is kept until the engine
        confirmed the new one), ``recovery`` what it holds. ``on_swapping`` is called
        once the gate is closed and drained: from then on the job is in the engine's
        hands and is not preempted. ``on_confirmed`` is called with the engine's report
        as soon as it names ``staged`` — before held requests resume and before the gate
        opens, so every token of the new weights is labelled with them.
        """
        path = self.staging.engine_path(slot, staged.identity)
        between = swaps_between_tokens(self.engine)
        stager = stages_switch(self.engine) if switch_at is not None else None
        if stager is not None or (transition is Transition.ASYNC and between is not None):
            on_swapping()
            if slot != served:
                await run_in_thread(self.staging.set_roles, served, slot)
            try:
                if stager is not None:
                    self.switched_at = await stager.switch_at(
                        staged.identity, switch_at, cache_policy=cache_policy
                    )
                else:
                    assert between is not None
                    await between.load_between_tokens(
                        path, staged.identity, kind=staged.kind, cache_policy=cache_policy
                    )
            except (EngineRejected, EngineBusy) as err:
                raise HandoverFailed(err, outcome_known=True) from err
            except Exception as err:  # a timeout, a lost answer, a server error: unknown
                raise HandoverFailed(err, outcome_known=False) from err
            report = await self._confirm(staged)
            await run_in_thread(self.staging.set_roles, slot, None)
            return report
        drain = transition is Transition.ASYNC and self._moves_adapter(staged)
        async with self.gate.swapping(transition, self.drain_timeout_s, drain=drain):
            on_swapping()
            if slot != served:
                # The served buffer needs no mark (it is never written while served); a
                # buffer handed earlier with its outcome unknown keeps its own until the
                # engine confirms this load, which tells that load is over too.
                await run_in_thread(self.staging.set_roles, served, slot)
            report = await self._load(
                path,
                staged,
                transition is Transition.ASYNC and not drain,
                cache_policy,
                recovery=(served, recovery) if served is not None and served != slot else None,
                on_confirmed=on_confirmed,
            )
            await run_in_thread(self.staging.set_roles, slot, None)
            if cache_policy is not None:
                await self._apply_cache_policy(cache_policy)
        return report

    async def apply_delta(
        self,
        engine: PatchesInPlace,
        target: Staged,
        *,
        transition: Transition,
        cache_policy: KvCachePolicy | None,
        on_swapping: Callable[[], None],
    ) -> EngineReport:
        """Hand the fetched, verified delta of ``target`` to the engine's in-place patch;
        the engine's report afterwards (it must name ``target`` with its digest).

        ASYNC: no pause, no held requests (the engine patches beside serving and copies
        the changed elements between two tokens). SYNC: the gate drains first, as for a
        load. :class:`PatchRefused` when the engine kept its old weights."""
        path = self.staging.engine_fetch_path(target.identity)
        if transition is Transition.ASYNC:
            on_swapping()
            await self._patch(engine, path, target, cache_policy)
            return await self._confirm(target)
        async with self.gate.swapping(transition, self.drain_timeout_s):
            on_swapping()
            await self._patch(engine, path, target, cache_policy)
            return await self._confirm(target)

    async def _patch(
        self,
        engine: PatchesInPlace,
        path: Path,
        target: Staged,
        cache_policy: KvCachePolicy | None,
    ) -> None:
        try:
            await engine.apply_delta(path, target.identity, cache_policy=cache_policy)
        except (DeltaNotApplicable, EngineRejected) as err:
            raise PatchRefused(err) from err
        except EngineBusy as err:
            raise HandoverFailed(err, outcome_known=True) from err
        except Exception as err:  # a timeout, a lost answer, a server error: unknown
            raise HandoverFailed(err, outcome_known=False) from err

    def _moves_adapter(self, staged: Staged) -> bool:
        """Whether this load changes the LoRA adapter of an engine that binds requests to
        one: its in-flight requests could not follow, so they finish before it."""
        binds = binds_adapter_per_request(self.engine)
        return binds is not None and (
            staged.kind is SnapshotKind.LORA or binds.active_lora is not None
        )

    async def _load(
        self,
        path: Path,
        staged: Staged,
        paused: bool,
        cache_policy: KvCachePolicy | None,
        *,
        recovery: tuple[Slot, Staged | None] | None,
        on_confirmed: Callable[[EngineReport], None] | None,
    ) -> EngineReport:
        """The load, its confirmation and, after a failure that may have touched the
        weights of an engine without rollback, the recovery — all while requests are
        held (``paused``: in place in the engine; else the gate is still closed and
        in-flight requests were drained). Nothing reaches the engine between a failed
        load and the reload of the served buffer: a vLLM left without weights dies on the
        next request (docs/engines.md)."""
        if paused:
            try:
                await self.engine.pause(PauseMode.IN_PLACE, cache_policy=cache_policy)
            except HotloadError as err:
                raise HandoverFailed(err, outcome_known=True) from err
        try:
            try:
                await self._load_weights(path, staged.identity, staged.kind)
            except HandoverFailed as failed:
                raise await self._recover(failed, recovery) from failed.error
            report = await self._confirm(staged)
            if on_confirmed is not None:
                on_confirmed(report)
            return report
        finally:
            if paused:
                await self._resume()

    async def _recover(
        self, failed: HandoverFailed, recovery: tuple[Slot, Staged | None] | None
    ) -> HandoverFailed:
        """After a failed load: reload the served buffer when the engine cannot be
        trusted to have kept its weights; the failure to raise (``weights_intact`` once
        the engine confirmed the served snapshot again)."""
        if isinstance(failed.error, LoadNotStarted):
            return HandoverFailed(failed.error, outcome_known=True, weights_intact=True)
        slot, served = recovery if recovery is not None else (None, None)
        if (
            self.engine.rollback_trusted
            or not failed.outcome_known  # it may still be loading: the settle decides
            or slot is None
            or served is None
        ):
            return failed
        log.warning(
            "the load failed; reloading the served snapshot before any request runs",
            extra={"snapshot": served.identity, "buffer": slot.value, "error": str(failed)},
        )
        path = self.staging.engine_path(slot, served.identity)
        for attempt in range(1, RECOVERY_ATTEMPTS + 1):
            try:
                await self._load_weights(path, served.identity, served.kind)
                await self._confirm(served)
            except HandoverFailed as again:
                log.warning(
                    "the recovery reload failed",
                    extra={"snapshot": served.identity, "attempt": attempt, "error": str(again)},
                )
                continue
            return HandoverFailed(failed.error, outcome_known=True, weights_intact=True)
        log.error(
            "the engine's weights are unknown: every recovery reload failed",
            extra={"snapshot": served.identity},
        )
        self.metrics.failures.labels(reason="RecoveryFailed").inc()
        return failed

    async def _load_weights(self, path: Path, identity: Identity, kind: SnapshotKind) -> None:
        try:
            await self.engine.load_weights(path, identity, kind=kind)
        except (EngineRejected, EngineBusy) as err:
            raise HandoverFailed(err, outcome_known=True) from err
        except Exception as err:  # a timeout, a lost answer, a server error: unknown
            raise HandoverFailed(err, outcome_known=False) from err

    async def _resume(self) -> None:
        """Resume, retrying for a while: a paused engine holds every request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_RETRY_S
        delay = 0.2
        while True:
            try:
                await self.engine.resume()
                return
            except HotloadError as err:
                if loop.time() >= deadline:
                    log.error("the engine did not resume", extra={"error": str(err)})
                    self.metrics.failures.labels(reason=err.reason).inc()
                    if self.on_left_paused is not None:
                        self.on_left_paused()
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _confirm(self, staged: Staged) -> EngineReport:
        """The engine's own word that it serves ``staged``, digest included where offered."""
        try:
            report = await self.engine.report(digest=True)
        except Exception as err:
            raise HandoverFailed(err, outcome_known=False) from err
        if report.identity != staged.identity:
            error = DigestMismatch(
                "after the load the engine names other weights",
                expected=staged.identity,
                found=report.identity,
            )
            raise HandoverFailed(error, outcome_known=True)
        if (
            report.digest is not None
            and staged.digest is not None
            and report.digest != staged.digest
        ):
            error = DigestMismatch(
                "the engine's weights differ from the verified snapshot",
                snapshot=staged.identity,
                expected=staged.digest,
                found=report.digest,
            )
            raise HandoverFailed(error, outcome_known=True)
        return report

    async def _apply_cache_policy(self, policy: KvCachePolicy) -> None:
        """The KV-cache policy after a swap; a refusal is recorded, the swap stands."""
        try:
            await self.engine.reset_cache(policy)
        except HotloadError as err:
            self.metrics.failures.labels(reason=err.reason).inc()
            log.warning(
                "KV-cache policy not applied after the swap",
                extra={"policy": policy.value, "error": str(err)},
            )
