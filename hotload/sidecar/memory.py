"""The agent's memory between jobs, and how each fact folds into it: pure, no I/O.

The sidecar has the operator's shape (docs/architecture.md, "The sidecar"): the
observer (:mod:`hotload.sidecar.observer`) judges the engine and returns what it found,
the job runner (:mod:`hotload.sidecar.jobs`) takes one step and returns its outcome,
and the loop (:mod:`hotload.sidecar.agent`) folds each of these *facts* into
:class:`Memory` with :func:`fold` — the only way the memory changes. The planner
(:mod:`hotload.sidecar.planning`) then reads the memory to choose the next step.

Most facts are folded when the observation or the job returns. A few take effect the
moment they are true, before the next await of the part that learned them, because the
engine already acts on them: a handover the engine confirmed (:class:`Swapped`), a
buffer read back from staging (:class:`BuffersRead`), weights lost after a failed load
(:class:`WeightsLost`). The runner hands those to the loop as it goes; they fold the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hotload.api import LoadPath, SnapshotRef
from hotload.api.kinds import Identity
from hotload.sidecar.planning import (
    Action,
    Attempts,
    Buffers,
    FailureDecision,
    Hold,
    Serving,
    Slot,
    Staged,
    same_snapshot,
    same_target,
)
from hotload.sidecar.status import EngineSeen


@dataclass(frozen=True)
class Retry:
    """When the next attempt at ``target`` may start (the event loop's clock)."""

    target: SnapshotRef | None
    at: float


@dataclass(frozen=True)
class Memory:
    """What the agent knows between jobs (the planner's inputs)."""

    serving: Serving | None = None
    buffers: Buffers = field(default_factory=lambda: Buffers({Slot.A: None, Slot.B: None}))
    hold: Hold | None = None
    attempts: Attempts = field(default_factory=Attempts)
    attempts_for: SnapshotRef | None = None
    fresh: bool = False
    """The next build replays from the last Full, every file fetched again."""
    retry: Retry | None = None
    engine_answers: bool = True
    unusable: frozenset[Slot] = frozenset()
    """Handed buffers whose files no longer verify: never loaded, kept untouched until
    the engine is known to be done with them."""
    unstaged_checked: frozenset[tuple[Identity, str | None]] = frozenset()
    """(identity, instance) the engine named that no bucket manifest confirmed."""
    unconfirmed: Identity | None = None
    """What the engine names while its check against the manifest is pending (as of the
    last observation): nothing is loaded over it (``StepKind.CONFIRM``)."""
    weights_unknown: bool = False
    """A load failed where a rollback is not trusted: the engine's label proves nothing
    until a load completes (the served buffer is reloaded)."""
    refused: SnapshotRef | None = None
    """A target the engine refused to patch in place (it is loaded as a directory)."""
    catch_up_given_up: SnapshotRef | None = None
    """A served snapshot whose catch-up into staging failed for good."""
    resume_owed: bool = True
    """The engine may be left paused: by a handover whose resume kept failing, or (at
    start) by a sidecar killed between its pause and its resume. Resumed once nothing is
    being loaded and the engine's weights are confirmed (resuming is idempotent)."""


# --- facts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuffersRead:
    """Both buffers as staging records them now (``buffers.json`` and the slots)."""

    buffers: Buffers


@dataclass(frozen=True)
class Observation:
    """What one look at the engine found (:class:`~hotload.sidecar.observer.EngineObserver`)."""

    seen: EngineSeen
    answers: bool
    lost: bool = False
    """The engine does not serve what the pod says (restarted, or serves other weights):
    the pod drops its snapshot at once."""
    again: bool = False
    """Look again at once, as a restarted sidecar would (it may serve something newer
    that can be adopted)."""
    served: Serving | None = None
    """Confirmed (a staged buffer, or a snapshot its manifest confirms): what it serves."""
    roles: tuple[Slot | None, Slot | None] | None = None
    """(served, handed) buffers after a confirmation."""
    unconfirmed: Identity | None = None
    checked: tuple[Identity, str | None] | None = None
    """A snapshot the engine names whose check against its manifest concluded."""
    unverified: bool = False
    """With ``lost``: the engine took a load we did not send and offers no digest to
    tell which weights it holds now; its label proves nothing until a load completes."""
    regenerated: str | None = None
    """The engine took a load we did not send, and its digest proves it still serves the
    weights we verified: this is its generation now."""
    paused: bool = False
    """The engine holds generation outside any handover of ours: it is resumed."""


@dataclass(frozen=True)
class Swapped:
    """The engine confirmed a load (or an in-place patch) of ``staged``."""

    staged: Staged
    via: LoadPath
    slot: Slot | None
    """The buffer it was loaded from (None: patched in the engine from the delta)."""
    instance_id: str | None
    target: SnapshotRef | None
    """The target this brought (None: a reload of what was served)."""
    generation: str | None = None
    """The engine's generation in the report that confirmed the load."""
    digest_confirmed: bool = False
    """The engine's report carried the snapshot's digest (:attr:`Serving.digest_confirmed`)."""


@dataclass(frozen=True)
class Served:
    """The engine confirmed it serves ``staged`` (from ``slot``), while the handover is
    still in hand: the front labels what it answers from now on with it."""

    staged: Staged
    via: LoadPath
    slot: Slot | None
    instance_id: str | None
    generation: str | None = None
    digest_confirmed: bool = False


@dataclass(frozen=True)
class CaughtUp:
    """Staging's ``slot`` now holds what the engine serves and is the served buffer."""

    slot: Slot


@dataclass(frozen=True)
class Refused:
    """The engine would not patch ``target`` in place: it loads as a directory."""

    target: SnapshotRef


@dataclass(frozen=True)
class Unusable:
    """A handed buffer no longer verifies: it is never loaded again."""

    slot: Slot


@dataclass(frozen=True)
class ResumeOwed:
    """A handover could not resume the engine (True), or a later resume did (False)."""

    owed: bool


@dataclass(frozen=True)
class WeightsLost:
    """A failed load left the engine's weights unknown: the pod serves nothing verified
    until a load completes."""


@dataclass(frozen=True)
class Failed:
    """A job failed; the planner's decision and what the replica reports if it holds."""

    decision: FailureDecision
    target: SnapshotRef | None
    message: str
    failed_identity: Identity | None
    retry_at: float | None = None
    """RETRY: when the next attempt may start."""


@dataclass(frozen=True)
class TargetSeen:
    """The target the loop decides for now (a new one starts its attempts afresh)."""

    target: SnapshotRef | None


@dataclass(frozen=True)
class RetryDue:
    """The retry's time came, or its target moved: it no longer holds the loop back."""


@dataclass(frozen=True)
class AtTarget:
    """The engine serves the target: its failures so far are forgotten."""


Fact = (
    BuffersRead
    | Observation
    | Swapped
    | Served
    | CaughtUp
    | Refused
    | Unusable
    | ResumeOwed
    | WeightsLost
    | Failed
    | TargetSeen
    | RetryDue
    | AtTarget
)


def _buffers_read(memory: Memory, buffers: Buffers) -> Memory:
    """A slot marked unusable reads as empty while it is still handed."""
    unusable = memory.unusable & ({buffers.handed} if buffers.handed is not None else set())
    contents = {slot: None if slot in unusable else held for slot, held in buffers.contents.items()}
    return replace(memory, buffers=replace(buffers, contents=contents), unusable=unusable)


def _observed(memory: Memory, seen: Observation) -> Memory:
    memory = replace(memory, engine_answers=seen.answers, unconfirmed=seen.unconfirmed)
    if seen.lost:
        memory = replace(memory, serving=None)
        if seen.unverified:
            memory = replace(memory, weights_unknown=True)
    if seen.regenerated is not None and memory.serving is not None:
        memory = replace(memory, serving=replace(memory.serving, generation=seen.regenerated))
    if seen.paused:
        memory = replace(memory, resume_owed=True)
    if seen.checked is not None:
        memory = replace(memory, unstaged_checked=memory.unstaged_checked | {seen.checked})
    if seen.roles is not None:
        served, handed = seen.roles
        memory = replace(memory, buffers=replace(memory.buffers, served=served, handed=handed))
    if seen.served is not None:
        memory = replace(memory, serving=seen.served, weights_unknown=False)
    return memory


def _confirmed(
    staged: Staged,
    via: LoadPath,
    slot: Slot | None,
    instance_id: str | None,
    generation: str | None,
    digest_confirmed: bool,
) -> Serving:
    """What the engine serves once it confirmed a load of ``staged`` from us."""
    return Serving(
        staged.identity,
        staged.step,
        staged.kind,
        via,
        slot,
        instance_id,
        digest=staged.digest,
        generation=generation,
        digest_confirmed=digest_confirmed,
    )


def _swapped(memory: Memory, fact: Swapped) -> Memory:
    staged, target = fact.staged, fact.target
    serving = _confirmed(
        staged, fact.via, fact.slot, fact.instance_id, fact.generation, fact.digest_confirmed
    )
    memory = replace(memory, serving=serving, weights_unknown=False)
    if fact.slot is not None:
        memory = replace(memory, buffers=replace(memory.buffers, served=fact.slot, handed=None))
    if target is not None:
        if memory.hold is not None and same_snapshot(memory.hold.target, target):
            memory = replace(memory, hold=None)
        memory = replace(memory, attempts=Attempts(), fresh=False)
    return memory


def _failed(memory: Memory, fact: Failed) -> Memory:
    decision, attempts, target = fact.decision, memory.attempts, fact.target
    if decision.counted:
        memory = replace(memory, attempts=replace(attempts, unexpected=attempts.unexpected + 1))
    else:
        memory = replace(memory, attempts=replace(attempts, transient=attempts.transient + 1))
    if decision.action is Action.RETRY:
        return replace(memory, retry=Retry(target, fact.retry_at or 0.0))
    if decision.action is Action.RETRY_FRESH:
        return replace(memory, fresh=True)
    if decision.action is Action.GIVE_UP:
        return replace(memory, catch_up_given_up=target)
    if target is None:
        return memory
    failed = fact.failed_identity or target.identity
    return replace(memory, hold=Hold(target, decision.reason, fact.message, failed))


def loses_serving(fact: Fact) -> bool:
    """The engine no longer serves what the pod said (the job in flight learns it too)."""
    return isinstance(fact, WeightsLost) or (isinstance(fact, Observation) and fact.lost)


def sets_serving(fact: Fact) -> bool:
    """The engine confirmed what it serves now."""
    if isinstance(fact, Swapped | Served):
        return True
    return isinstance(fact, Observation) and fact.served is not None


def fold(memory: Memory, fact: Fact) -> Memory:
    """The memory once ``fact`` is known."""
    match fact:
        case BuffersRead(buffers):
            return _buffers_read(memory, buffers)
        case Observation():
            return _observed(memory, fact)
        case Swapped():
            return _swapped(memory, fact)
        case Served(staged, via, slot, instance_id, generation, digest_confirmed):
            confirmed = _confirmed(staged, via, slot, instance_id, generation, digest_confirmed)
            return replace(memory, serving=confirmed, weights_unknown=False)
        case CaughtUp(slot):
            moved = replace(memory.serving, slot=slot) if memory.serving is not None else None
            buffers = replace(memory.buffers, served=slot)
            return replace(memory, buffers=buffers, serving=moved, fresh=False)
        case Refused(target):
            return replace(memory, refused=target)
        case Unusable(slot):
            return replace(memory, unusable=memory.unusable | {slot})
        case ResumeOwed(owed):
            return replace(memory, resume_owed=owed)
        case WeightsLost():
            return replace(memory, serving=None, weights_unknown=True)
        case Failed():
            return _failed(memory, fact)
        case TargetSeen(target):
            if same_target(memory.attempts_for, target):
                return memory
            return replace(memory, attempts=Attempts(), attempts_for=target, fresh=False)
        case RetryDue():
            return replace(memory, retry=None)
        case AtTarget():
            return replace(memory, attempts=Attempts())
