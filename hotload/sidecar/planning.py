"""The agent's decisions, as pure functions of what it observed (no I/O, no clock).

The agent (``agent.py``) only observes and executes; every choice is made here, so that
each one is a row in a table test (``tests/unit/sidecar/test_planning.py``):

- :func:`judge_engine` — what the engine's own report means for what the pod may say:
  still the snapshot we loaded, restarted (or loaded by someone else), a load we did not
  send under the name it serves (its generation moved; :func:`foreign_load_verified`
  says whether its digest proves our weights), a load of unknown outcome that landed, or
  (after a sidecar restart) a staged snapshot to adopt.
- :func:`next_step` — what to do now: wait for the engine, settle a load of unknown
  outcome, reload the served buffer, wait for the check of a snapshot the engine names,
  swap an already built target, build the target, catch staging up with a snapshot the
  engine serves but no buffer holds, or nothing (Ready, Failed, no target).
- :func:`choose_route` — how the target reaches the engine: its one delta patched into
  the engine's live weights (the engine serves exactly that delta's previous snapshot and
  can patch in place), or a rebuilt directory loaded.
- :func:`choose_build` — how to build the target into the free buffer: patch what that
  buffer holds in place, rebuild from the served buffer, or replay from a Full.
- :func:`after_failure` — retry (with which backoff attempt), replay from the Full
  fetched again, or fail with which reason; and whether the engine's weights are now
  unknown (a reload follows) or a load's outcome is (a settling load follows).
- :func:`should_preempt` — whether a newer target (or a restarted engine) cancels the
  job in flight.
- :func:`replica_state` — the ``state`` annotation from the same facts.

"A target" is always a whole reference: identity, step and kind (:func:`same_snapshot`);
a target corrected in its step alone is a new target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from hotload.api import LoadPath, ReplicaState, SnapshotKind, SnapshotRef, snapshot_order
from hotload.api.kinds import Identity
from hotload.api.reasons import (
    DIGEST_MISMATCH,
    ENGINE_BUSY,
    ENGINE_REJECTED,
    INTERNAL_ERROR,
    ReasonClass,
    reason_class,
)
from hotload.engines.protocol import EngineReport
from hotload.snapshot import UpdatePlan

#: Unexpected failures (and digest mismatches) retried as transient before Failed.
DEFAULT_UNEXPECTED_CAP = 5


class Slot(StrEnum):
    """One of the two staging buffers."""

    A = "a"
    B = "b"

    @property
    def other(self) -> Slot:
        return Slot.B if self is Slot.A else Slot.A


@dataclass(frozen=True)
class Staged:
    """A verified rebuild held by a buffer (the decoder's record of it)."""

    identity: Identity
    step: int
    kind: SnapshotKind
    digest: str | None
    """The rebuilt tensors' set digest (``manifest_digest`` of its manifest)."""


@dataclass(frozen=True)
class Buffers:
    """The two buffers: what each holds, which one the engine serves from, and which one
    was handed to the engine without a confirmed outcome (it may still be reading it)."""

    contents: Mapping[Slot, Staged | None]
    served: Slot | None = None
    """The buffer of the snapshot last confirmed loaded: never written while it is."""
    handed: Slot | None = None
    """Handed to the engine, outcome unknown (a sidecar restart or a lost answer):
    assumed in use, so never written until the outcome is settled."""

    def held(self, slot: Slot | None) -> Staged | None:
        return None if slot is None else self.contents.get(slot)

    def in_use(self, slot: Slot) -> bool:
        return slot in (self.served, self.handed)

    def free_slot(self) -> Slot | None:
        """Where the next build goes: a buffer the engine neither serves nor may read."""
        free = [slot for slot in Slot if not self.in_use(slot)]
        if not free:
            return None
        if len(free) == 2 and self.held(Slot.A) is None and self.held(Slot.B) is not None:
            return Slot.B  # its content may be patched in place
        return free[0]


@dataclass(frozen=True)
class Serving:
    """What the engine serves, verified by us and confirmed by its own report."""

    identity: Identity
    step: int
    kind: SnapshotKind
    via: LoadPath | None
    """How it was reached (None: adopted from the engine, path unknown)."""
    slot: Slot | None
    """The buffer it was loaded from (None: adopted from the engine, not staged here)."""
    instance_id: str | None
    digest: str | None = None
    """The weights digest it was verified with (the staged rebuild's or the manifest's
    ``manifest_digest``; None where not known)."""
    generation: str | None = None
    """The engine's generation when we confirmed it (:attr:`EngineReport.generation`):
    another value later, same instance, is a load we did not send."""
    digest_confirmed: bool = False
    """The engine itself reported ``digest`` when it confirmed the load (checked equal): only
    then does the pod report carry it (``hotload.dev/digest``, which the operator
    corroborates); an engine that offers no digest leaves it False."""


def unconfirmed_backward(
    target: SnapshotRef | None, serving: Serving | None, rolled_back_to: Identity | None
) -> bool:
    """The target ranks below what the engine serves, and the operator's record of its own
    backward move (``status.rollback.toIdentity``, ``rolled_back_to``) does not name it:
    another writer moved the target back. The replica does not load it, and waits for the
    operator's repair."""
    if target is None or serving is None:
        return False
    behind = snapshot_order(target.step, target.kind) < snapshot_order(serving.step, serving.kind)
    return behind and rolled_back_to != target.identity


def confirms_digest(reported: str | None, expected: str | None) -> bool:
    """The engine reported a digest and it is the snapshot's (the pod may report it)."""
    return reported is not None and reported == expected


def same_snapshot(
    a: SnapshotRef | Serving | Staged | None, b: SnapshotRef | Serving | Staged | None
) -> bool:
    """Identity, step and kind all equal (the cache policy is not part of a snapshot)."""
    if a is None or b is None:
        return False
    return (a.identity, a.step, a.kind) == (b.identity, b.step, b.kind)


def same_target(a: SnapshotRef | None, b: SnapshotRef | None) -> bool:
    """Both no target, or the same snapshot (:func:`same_snapshot`)."""
    return (a is None and b is None) or same_snapshot(a, b)


def _digest_agrees(reported: str | None, expected: str | None) -> bool:
    return reported is None or expected is None or reported == expected


# --- what the engine says -------------------------------------------------------------


class Verdict(StrEnum):
    CONSISTENT = "Consistent"
    """The engine serves what the pod says."""
    UNREACHABLE = "Unreachable"
    """No answer: keep what we know until it answers (the runtime restarts it)."""
    LOST = "Lost"
    """It restarted, or serves something else than we loaded: the pod serves nothing
    verified until a reload (or the next load) succeeds."""
    LANDED = "Landed"
    """A load of unknown outcome took: that buffer is now the served one."""
    ADOPT = "Adopt"
    """After a sidecar restart: the engine serves a snapshot a buffer holds verified."""
    ADOPT_UNSTAGED = "AdoptUnstaged"
    """After a sidecar restart: the engine names a snapshot no buffer holds; the agent
    checks it against its manifest (digest where the engine gives one) before trusting."""
    EMPTY = "Empty"
    """It serves nothing we know of (its initial weights, or nothing)."""
    FOREIGN_LOAD = "ForeignLoad"
    """Same instance, same name, but its generation moved since we confirmed it: it took
    a load we did not send (under the name it serves). Re-verified before the pod says
    the snapshot again (:func:`foreign_load_verified`)."""


@dataclass(frozen=True)
class EngineJudgement:
    verdict: Verdict
    slot: Slot | None = None
    identity: Identity | None = None
    detail: str = ""


def judge_engine(
    serving: Serving | None,
    report: EngineReport | None,
    buffers: Buffers,
    *,
    weights_unknown: bool = False,
) -> EngineJudgement:
    """What the engine's report means for what the pod may say.

    ``weights_unknown``: a load failed on an engine whose rollback is not trusted
    (SGLang, vLLM keep their old version label over part-new weights): its label proves
    nothing until the served buffer is loaded again, so nothing is adopted from it.
    """
    if report is None:
        return EngineJudgement(Verdict.UNREACHABLE)
    if weights_unknown and serving is None:
        return EngineJudgement(
            Verdict.EMPTY, identity=report.identity, detail="weights unknown after a failed load"
        )
    handed = buffers.held(buffers.handed)
    if handed is not None and report.identity == handed.identity:
        if _digest_agrees(report.digest, handed.digest):
            return EngineJudgement(Verdict.LANDED, buffers.handed, handed.identity)
        return EngineJudgement(
            Verdict.LOST, detail=f"the engine serves other weights under {handed.identity}"
        )
    if serving is not None:
        if (
            serving.instance_id is not None
            and report.instance_id is not None
            and serving.instance_id != report.instance_id
        ):
            return EngineJudgement(
                Verdict.LOST,
                detail=f"the engine restarted (instance {report.instance_id})",
            )
        if report.identity != serving.identity:
            return EngineJudgement(
                Verdict.LOST,
                identity=report.identity,
                detail=f"the engine serves {report.identity or 'nothing'}, not {serving.identity}",
            )
        if (
            serving.generation is not None
            and report.generation is not None
            and report.generation != serving.generation
        ):
            return EngineJudgement(
                Verdict.FOREIGN_LOAD,
                serving.slot,
                serving.identity,
                detail=(
                    f"the engine took a load we did not send (generation "
                    f"{serving.generation} -> {report.generation})"
                ),
            )
        return EngineJudgement(Verdict.CONSISTENT, serving.slot, serving.identity)
    identity = report.identity
    if identity is None:
        return EngineJudgement(Verdict.EMPTY, identity=identity)
    order = [buffers.served] if buffers.served is not None else []
    order += [slot for slot in Slot if slot not in order]
    for slot in order:
        staged = buffers.held(slot)
        if staged is not None and staged.identity == identity:
            if _digest_agrees(report.digest, staged.digest):
                return EngineJudgement(Verdict.ADOPT, slot, identity)
            return EngineJudgement(
                Verdict.EMPTY, identity=identity, detail="digest differs from the staged rebuild"
            )
    return EngineJudgement(Verdict.ADOPT_UNSTAGED, identity=identity)


def foreign_load_verified(serving: Serving, report: EngineReport) -> bool:
    """After a load we did not send: whether the engine's digest (asked for) proves it
    still serves the weights we verified. An engine without a digest proves nothing:
    the served snapshot is then reloaded, never claimed on its label alone."""
    return (
        report.identity == serving.identity
        and report.digest is not None
        and serving.digest is not None
        and report.digest == serving.digest
    )


# --- what to do next ------------------------------------------------------------------


class StepKind(StrEnum):
    WAIT_ENGINE = "WaitEngine"
    """The engine does not answer, or no buffer may be written (one served, the other
    handed with its outcome unknown and no longer loadable): nothing can be loaded."""
    SETTLE = "Settle"
    """A load of unknown outcome: load a verified buffer — the one holding the target,
    else the handed one, else the served one. Engines run one load at a time, so once
    this one returns the earlier one is over and the buffers' roles are known again.
    The handed buffer goes before the served one because the unknown load may have
    landed after the engine's last report (its answer lost, or still reading): loading
    the served, older snapshot then would take the engine back to weights it already
    left — after the pod may have said Ready on the new ones."""
    RELOAD = "Reload"
    """The engine lost its weights (restart, untrusted failed load): load the served
    buffer again (``via: reload``). Never while the engine names a snapshot whose check
    is pending (:attr:`CONFIRM`): that may be a newer snapshot than the served buffer's
    (patched in place), and the reload would take the engine back to it."""
    CONFIRM = "Confirm"
    """The engine names a snapshot no buffer holds, and its check against the manifest
    (and digest) has not concluded yet — the bucket did not answer, or the deployment is
    not known yet (a restarted sidecar, or a load whose answer was lost, after a delta
    patched in place). Nothing is loaded over it meanwhile; the check is retried at the
    next observation. Only a check that concludes the weights are not what the engine
    names lets the served buffer be reloaded."""
    IDLE = "Idle"
    """No target."""
    HOLD = "Hold"
    """The target failed for good: keep serving, stay Failed until the target moves."""
    READY = "Ready"
    """The engine serves the target."""
    SWAP = "Swap"
    """The free buffer already holds the target, verified: hand it over."""
    BUILD = "Build"
    """Bring the target to the engine: its delta patched in the engine
    (:func:`choose_route`), else built into the free buffer and handed over."""
    CATCH_UP = "CatchUp"
    """The engine serves the target, but the served buffer holds another snapshot (the
    engine patched a delta in place, or a restarted sidecar adopted what the engine
    named): build the target into the free buffer, off the critical path, and make it the
    served buffer — no load, the engine already serves it — so a restarted engine
    reloads the snapshot it served. Until then a restart reloads the older served
    buffer (verified) and the target is reached again."""


@dataclass(frozen=True)
class Step:
    kind: StepKind
    slot: Slot | None = None
    """SETTLE/RELOAD/SWAP: the buffer handed to the engine. BUILD: the buffer built into."""
    target: SnapshotRef | None = None


@dataclass(frozen=True)
class Hold:
    """A target that failed for good (a whole reference), and why."""

    target: SnapshotRef
    reason: str
    message: str
    failed_identity: Identity


def staged_behind(serving: Serving | None, buffers: Buffers) -> bool:
    """The engine serves a snapshot that the served buffer does not hold."""
    return serving is not None and not same_snapshot(buffers.held(buffers.served), serving)


def _settles_forward(
    held: Staged, target: SnapshotRef | None, serving: Serving | None, unconfirmed: str | None
) -> bool:
    """Whether loading ``held`` to settle leaves the engine no further back than what it
    serves: the target, or nothing older than its confirmed snapshot (or, while a check
    is pending, that very snapshot)."""
    if same_snapshot(held, target):
        return True
    if serving is not None:
        return held.step >= serving.step
    if unconfirmed is not None:
        return held.identity == unconfirmed
    return True


def next_step(
    target: SnapshotRef | None,
    serving: Serving | None,
    buffers: Buffers,
    hold: Hold | None,
    *,
    engine_answers: bool,
    catch_up_given_up: SnapshotRef | None = None,
    engine_unconfirmed: str | None = None,
) -> Step:
    """The one thing to do now, from what is known (see :class:`StepKind`).

    ``catch_up_given_up``: a snapshot whose catch-up failed for good (it is not tried
    again; the served buffer stays the older snapshot).
    ``engine_unconfirmed``: the identity the engine names while its check against the
    manifest is pending (:attr:`StepKind.CONFIRM`)."""
    if not engine_answers:
        return Step(StepKind.WAIT_ENGINE)
    if buffers.handed is not None:
        # Settle forward: whatever the unknown load did, loading the target (or the
        # handed buffer) again never leaves the engine behind a snapshot it may already
        # serve; a buffer that would take it back from what it serves is not loaded.
        roles = (buffers.served, buffers.handed)
        holds_target = [slot for slot in roles if same_snapshot(buffers.held(slot), target)]
        for slot in (*holds_target, buffers.handed, buffers.served):
            held = buffers.held(slot)
            if held is not None and _settles_forward(held, target, serving, engine_unconfirmed):
                return Step(StepKind.SETTLE, slot)
        # Nothing loadable settles forward: the handed buffer stays untouched, and the
        # target is brought through the free buffer, if there is one (below).
    if serving is None and engine_unconfirmed is not None:
        if target is None or target.identity == engine_unconfirmed:
            return Step(StepKind.CONFIRM, target=target)
        # The target is another snapshot: bringing it is no step back (below).
    elif serving is None and buffers.held(buffers.served) is not None:
        return Step(StepKind.RELOAD, buffers.served)
    if target is None:
        return Step(StepKind.IDLE)
    if hold is not None and same_snapshot(hold.target, target):
        return Step(StepKind.HOLD, target=target)
    if serving is not None and same_snapshot(serving, target):
        free = buffers.free_slot()
        if (
            staged_behind(serving, buffers)
            and free is not None
            and not same_snapshot(catch_up_given_up, target)
        ):
            return Step(StepKind.CATCH_UP, free, target)
        return Step(StepKind.READY, serving.slot, target)
    for slot in Slot:
        if not buffers.in_use(slot) and same_snapshot(buffers.held(slot), target):
            return Step(StepKind.SWAP, slot, target)
    free = buffers.free_slot()
    if free is None:
        return Step(StepKind.WAIT_ENGINE)
    return Step(StepKind.BUILD, free, target)


# --- how the target reaches the engine ------------------------------------------------


class Route(StrEnum):
    IN_ENGINE = "InEngine"
    """Fetch and verify the target's delta only, and hand it to the engine's in-place
    patch; a refusal (it cannot, or a tensor failed its check: the old weights serve on)
    falls back to the directory load in the same job."""
    DIRECTORY = "Directory"
    """Build the target into the free buffer and hand that directory over."""


def choose_route(
    target: SnapshotRef,
    serving: Serving | None,
    from_serving: UpdatePlan | None,
    *,
    patches_in_place: bool,
    fresh: bool,
    refused: SnapshotRef | None,
) -> Route:
    """Patch in the engine only for a one-delta step from what the engine itself serves.

    ``serving`` is what the engine's own report confirmed (identity, and digest where it
    gives one); ``from_serving`` the chain planner's plan from that identity. Anything
    else — no confirmed snapshot, more than one delta, a Full, a fresh replay (the
    bucket is being re-read: the rebuild tells bad files from bad copies), an engine
    without the capability, or one that already refused this target — loads a
    directory.
    """
    if not patches_in_place or fresh or serving is None or from_serving is None:
        return Route.DIRECTORY
    if same_snapshot(refused, target) or target.kind is not SnapshotKind.INCREMENTAL:
        return Route.DIRECTORY
    if from_serving.via is not LoadPath.DELTA or from_serving.apply != (target.identity,):
        return Route.DIRECTORY
    return Route.IN_ENGINE


# --- how to build ---------------------------------------------------------------------


class Base(StrEnum):
    IN_PLACE = "InPlace"
    """Patch the free buffer's own older content through the deltas."""
    FROM_SERVED = "FromServed"
    """Read the served buffer (never written), write the first delta's result fresh into
    the free buffer, patch the rest in place."""
    EMPTY = "Empty"
    """From nothing: the Full (``full``), or the chain from its last Full (``replay``)."""


@dataclass(frozen=True)
class BuildChoice:
    base: Base
    plan: UpdatePlan
    """Snapshots to apply in order (``plan.via`` is what the pod's ``via`` will say)."""


@dataclass(frozen=True)
class BuildOptions:
    """The chain planner's answers for each possible base (None: no such base)."""

    in_place: UpdatePlan | None
    """From what the free buffer holds."""
    from_served: UpdatePlan | None
    """From what the served buffer holds."""
    from_nothing: UpdatePlan


def _deltas(plan: UpdatePlan | None) -> int | None:
    if plan is None or plan.via is not LoadPath.DELTA or not plan.apply:
        return None
    return len(plan.apply)


def choose_build(options: BuildOptions, *, fresh: bool) -> BuildChoice:
    """Cheapest safe base. ``fresh``: a replay from the Full, every file fetched again
    (after a chain-breaking failure, to tell a bad bucket from a bad replica).

    Patching the free buffer costs the changed pages of each delta; rebuilding from the
    served buffer costs one copy of the model plus its deltas. The free buffer usually
    holds the snapshot before the served one, one delta further back: patching it is
    chosen while it needs at most one delta more than the served buffer does.
    """
    if fresh:
        return BuildChoice(Base.EMPTY, options.from_nothing)
    in_place = _deltas(options.in_place)
    from_served = _deltas(options.from_served)
    if (
        in_place is not None
        and options.in_place is not None
        and (from_served is None or in_place <= from_served + 1)
    ):
        return BuildChoice(Base.IN_PLACE, options.in_place)
    if from_served is not None and options.from_served is not None:
        return BuildChoice(Base.FROM_SERVED, options.from_served)
    return BuildChoice(Base.EMPTY, options.from_nothing)


# --- failures -------------------------------------------------------------------------


class Job(StrEnum):
    """What the failed (or preempted) work was doing."""

    BUILD = "Build"
    """Plan, fetch, verify, rebuild into the free buffer (the engine untouched)."""
    DRAIN = "Drain"
    """SYNC: waiting for in-flight requests before the swap (the engine untouched)."""
    SWAP = "Swap"
    """Handing the target's buffer to the engine."""
    RELOAD = "Reload"
    """Handing a buffer the engine served (or was handed) to it again: a reload or a
    settling load."""
    CATCH_UP = "CatchUp"
    """Building the snapshot the engine already serves into the free buffer (the engine
    untouched; its failure never fails the replica)."""


@dataclass(frozen=True)
class Failure:
    reason: str
    """The error's reason word."""
    job: Job
    expected: bool = True
    """False: not one of our typed errors (a bug, or a failure nobody mapped)."""
    fresh: bool = False
    """BUILD: the attempt was already a replay from the Full, every file fetched again."""
    outcome_known: bool = True
    """SWAP: the engine answered whether it took the load (False: a timeout, a lost
    connection, a server error — it may have loaded, or may still be loading)."""


@dataclass(frozen=True)
class Attempts:
    """Consecutive failures of the current target so far (before this one)."""

    transient: int = 0
    unexpected: int = 0


class Action(StrEnum):
    RETRY = "Retry"
    """Try again after ``backoff_attempt``'s delay."""
    RETRY_FRESH = "RetryFresh"
    """At once: replay from the last Full, every file fetched again."""
    FAIL = "Fail"
    """Failed with ``reason`` until the target moves."""
    GIVE_UP = "GiveUp"
    """CATCH_UP: stop catching staging up with this snapshot. The replica stays Ready
    (the engine serves the target); a restarted engine reloads the older served buffer
    and the target is reached again from there."""


@dataclass(frozen=True)
class FailureDecision:
    action: Action
    reason: str
    backoff_attempt: int = 0
    """Which delay of the backoff sequence to wait before retrying."""
    counted: bool = False
    """It counts against the cap of unexpected failures (else against transient ones)."""
    weights_unknown: bool = False
    """The engine's weights are not known any more: the pod drops its snapshot and the
    served buffer is reloaded."""
    outcome_unknown: bool = False
    """The load's outcome is not known: the buffer stays handed and is settled next."""
    abandon_buffer: bool = False
    """RELOAD: the buffer cannot be loaded; it is no longer a source of reloads."""


def after_failure(
    failure: Failure,
    attempts: Attempts,
    *,
    rollback_trusted: bool,
    unexpected_cap: int = DEFAULT_UNEXPECTED_CAP,
) -> FailureDecision:
    """Retry, replay afresh, or fail — and what the engine's state is now.

    Transient reasons are retried with backoff for as long as they last. A bug (an
    unexpected exception), a digest mismatch or an unknown load outcome is retried as
    transient up to ``unexpected_cap`` times, then Failed (``InternalError`` for a bug).
    A chain-breaking reason is first retried as a replay from the Full with every file
    fetched again; only when that fails too is it reported. A catch-up never fails the
    replica (the engine serves the target): transient reasons are retried, a
    chain-breaking one is replayed afresh once (a corrupt copy in staging is healed from
    the bucket), anything else gives up.
    """
    reason = failure.reason if failure.expected else INTERNAL_ERROR
    klass = reason_class(reason)
    transient = failure.expected and klass is ReasonClass.TRANSIENT
    if failure.job is Job.CATCH_UP:
        if transient:
            return FailureDecision(Action.RETRY, reason, backoff_attempt=attempts.transient)
        if failure.expected and klass is ReasonClass.CHAIN_BREAKING and not failure.fresh:
            return FailureDecision(Action.RETRY_FRESH, reason)
        return FailureDecision(Action.GIVE_UP, reason)
    if failure.job in (Job.BUILD, Job.DRAIN):
        if transient:
            return FailureDecision(Action.RETRY, reason, backoff_attempt=attempts.transient)
        if not failure.expected:
            return _capped(reason, attempts, unexpected_cap)
        if klass is ReasonClass.CHAIN_BREAKING and not failure.fresh:
            return FailureDecision(Action.RETRY_FRESH, reason)
        return FailureDecision(Action.FAIL, reason)
    if failure.job is Job.RELOAD:
        if transient:
            return FailureDecision(Action.RETRY, reason, backoff_attempt=attempts.transient)
        return _capped(reason, attempts, unexpected_cap, abandon_buffer=True)
    # Job.SWAP: the target's buffer was handed to the engine.
    if reason == ENGINE_BUSY:
        return FailureDecision(Action.RETRY, reason, backoff_attempt=attempts.transient)
    if not failure.outcome_known:
        if transient:
            return FailureDecision(
                Action.RETRY, reason, backoff_attempt=attempts.transient, outcome_unknown=True
            )
        return _capped(reason, attempts, unexpected_cap, outcome_unknown=True)
    if reason == DIGEST_MISMATCH:
        return _capped(reason, attempts, unexpected_cap, weights_unknown=True)
    if reason == ENGINE_REJECTED or klass is not ReasonClass.TRANSIENT:
        return FailureDecision(Action.FAIL, reason, weights_unknown=not rollback_trusted)
    return FailureDecision(Action.RETRY, reason, backoff_attempt=attempts.transient)


def _capped(
    reason: str,
    attempts: Attempts,
    cap: int,
    *,
    weights_unknown: bool = False,
    outcome_unknown: bool = False,
    abandon_buffer: bool = False,
) -> FailureDecision:
    """Retried as transient until the cap, then Failed. At the cap a load of unknown
    outcome is given up: its buffer is no longer trusted, the engine's weights unknown."""
    if attempts.unexpected + 1 >= cap:
        return FailureDecision(
            Action.FAIL,
            reason,
            counted=True,
            weights_unknown=weights_unknown or outcome_unknown,
            abandon_buffer=abandon_buffer,
        )
    return FailureDecision(
        Action.RETRY,
        reason,
        backoff_attempt=attempts.unexpected,
        counted=True,
        weights_unknown=weights_unknown,
        outcome_unknown=outcome_unknown,
    )


# --- preemption -----------------------------------------------------------------------


def should_preempt(
    job: Job, working_on: SnapshotRef | None, target: SnapshotRef | None, *, engine_lost: bool
) -> bool:
    """Whether the job in flight is cancelled. A job the engine has in hand (a swap) is
    never abandoned; building, draining or catching up for a target that is no longer
    the target is; so is building or catching up while the engine lost its weights (the
    served buffer is reloaded first, the build starts again from its downloaded files)."""
    if job in (Job.SWAP, Job.RELOAD) or working_on is None:
        return False
    if not same_snapshot(working_on, target):
        return True
    return engine_lost and job in (Job.BUILD, Job.CATCH_UP)


# --- what the pod says ----------------------------------------------------------------


def replica_state(
    target: SnapshotRef | None, serving: Serving | None, hold: Hold | None
) -> ReplicaState | None:
    """``state`` relative to the target: Ready only when the engine serves it."""
    if target is None:
        return ReplicaState.READY if serving is not None else None
    if hold is not None and same_snapshot(hold.target, target):
        return ReplicaState.FAILED
    if serving is not None and same_snapshot(serving, target):
        return ReplicaState.READY
    return ReplicaState.LOADING


__all__ = [
    "DEFAULT_UNEXPECTED_CAP",
    "Action",
    "Attempts",
    "Base",
    "Buffers",
    "BuildChoice",
    "BuildOptions",
    "EngineJudgement",
    "Failure",
    "FailureDecision",
    "Hold",
    "Job",
    "Route",
    "Serving",
    "Slot",
    "Staged",
    "Step",
    "StepKind",
    "Verdict",
    "after_failure",
    "choose_build",
    "choose_route",
    "foreign_load_verified",
    "judge_engine",
    "next_step",
    "replica_state",
    "same_snapshot",
    "same_target",
    "should_preempt",
    "staged_behind",
]
