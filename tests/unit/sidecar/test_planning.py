"""The agent's decisions as tables: each row is a situation and the one right answer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hotload.api import KvCachePolicy, LoadPath, ReplicaState, SnapshotKind, SnapshotRef
from hotload.api import reasons as r
from hotload.engines.protocol import EngineReport
from hotload.sidecar.planning import (
    Action,
    Attempts,
    Base,
    Buffers,
    BuildOptions,
    Failure,
    Hold,
    Job,
    Serving,
    Slot,
    Staged,
    Step,
    StepKind,
    Verdict,
    after_failure,
    choose_build,
    confirms_digest,
    judge_engine,
    next_step,
    replica_state,
    same_snapshot,
    should_preempt,
    unconfirmed_backward,
)
from hotload.snapshot import UpdatePlan

A, B = Slot.A, Slot.B
FULL, DELTA = SnapshotKind.FULL, SnapshotKind.INCREMENTAL


def ref(step: int, kind: SnapshotKind = DELTA, identity: str | None = None) -> SnapshotRef:
    return SnapshotRef(
        identity=identity or f"s{step}",
        step=step,
        kind=kind,
        kv_cache_policy=KvCachePolicy.ALL,
    )


def staged(step: int, kind: SnapshotKind = DELTA, digest: str | None = None) -> Staged:
    return Staged(f"s{step}", step, kind, digest or f"d{step}")


def serving(
    step: int, slot: Slot | None = A, instance: str | None = "i1", kind: SnapshotKind = DELTA
) -> Serving:
    return Serving(f"s{step}", step, kind, LoadPath.DELTA, slot, instance)


def buffers(
    a: Staged | None = None,
    b: Staged | None = None,
    served: Slot | None = None,
    handed: Slot | None = None,
) -> Buffers:
    return Buffers({A: a, B: b}, served=served, handed=handed)


def report(
    identity: str | None, instance: str | None = "i1", digest: str | None = None
) -> EngineReport:
    return EngineReport(identity, instance, digest)


# --- judge_engine -----------------------------------------------------------------------

JUDGE = [
    # (name, serving, report, buffers, verdict, slot)
    (
        "no answer keeps what we know",
        serving(5),
        None,
        buffers(staged(5), served=A),
        Verdict.UNREACHABLE,
        None,
    ),
    (
        "same identity and instance",
        serving(5),
        report("s5"),
        buffers(staged(5), served=A),
        Verdict.CONSISTENT,
        A,
    ),
    (
        "restarted on its launch weights",
        serving(5),
        report(None, "i2"),
        buffers(staged(5), served=A),
        Verdict.LOST,
        None,
    ),
    (
        "restarted, same name, new instance",
        serving(5),
        report("s5", "i2"),
        buffers(staged(5), served=A),
        Verdict.LOST,
        None,
    ),
    (
        "no instance ids: identity decides",
        serving(5, instance=None),
        report("s5", None),
        buffers(staged(5), served=A),
        Verdict.CONSISTENT,
        A,
    ),
    (
        "someone else loaded other weights",
        serving(5),
        report("s9"),
        buffers(staged(5), served=A),
        Verdict.LOST,
        None,
    ),
    (
        "handed load landed",
        serving(5),
        report("s6", digest="d6"),
        buffers(staged(5), staged(6), served=A, handed=B),
        Verdict.LANDED,
        B,
    ),
    (
        "handed load landed, no digest offered",
        None,
        report("s6"),
        buffers(staged(5), staged(6), served=A, handed=B),
        Verdict.LANDED,
        B,
    ),
    (
        "handed identity but other weights",
        serving(5),
        report("s6", digest="zz"),
        buffers(staged(5), staged(6), served=A, handed=B),
        Verdict.LOST,
        None,
    ),
    (
        "pending handed load: still the old one",
        serving(5),
        report("s5"),
        buffers(staged(5), staged(6), served=A, handed=B),
        Verdict.CONSISTENT,
        A,
    ),
    (
        "restart: engine serves the served buffer",
        None,
        report("s5", digest="d5"),
        buffers(staged(5), served=A),
        Verdict.ADOPT,
        A,
    ),
    (
        "restart: engine serves the other buffer",
        None,
        report("s4"),
        buffers(staged(5), staged(4), served=A),
        Verdict.ADOPT,
        B,
    ),
    (
        "restart: digest differs from staging",
        None,
        report("s5", digest="xx"),
        buffers(staged(5), served=A),
        Verdict.EMPTY,
        None,
    ),
    (
        "restart: nothing staged, engine names one",
        None,
        report("s5"),
        buffers(),
        Verdict.ADOPT_UNSTAGED,
        None,
    ),
    (
        "restart: engine on launch weights",
        None,
        report(None),
        buffers(staged(5), served=A),
        Verdict.EMPTY,
        None,
    ),
]


@pytest.mark.parametrize(
    ("serving_", "report_", "buffers_", "verdict", "slot"),
    [row[1:] for row in JUDGE],
    ids=[row[0] for row in JUDGE],
)
def test_judge_engine(
    serving_: Serving | None,
    report_: EngineReport | None,
    buffers_: Buffers,
    verdict: Verdict,
    slot: Slot | None,
) -> None:
    judgement = judge_engine(serving_, report_, buffers_)
    assert (judgement.verdict, judgement.slot) == (verdict, slot)


# --- next_step --------------------------------------------------------------------------

NEXT = [
    # (name, target, serving, buffers, hold, engine answers, step)
    (
        "engine down",
        ref(6),
        serving(5),
        buffers(staged(5), served=A),
        None,
        False,
        Step(StepKind.WAIT_ENGINE),
    ),
    (
        # The load of s6 may land after the engine's last report: loading s5 then would
        # take the engine back from s6 (after the pod may have said Ready on it).
        "unknown outcome: settle forward with the handed buffer",
        ref(7),
        serving(5),
        buffers(staged(5), staged(6), A, B),
        None,
        True,
        Step(StepKind.SETTLE, B),
    ),
    (
        "unknown outcome, the handed buffer is the target: settle with it",
        ref(6),
        serving(5),
        buffers(staged(5), staged(6), A, B),
        None,
        True,
        Step(StepKind.SETTLE, B),
    ),
    (
        "unknown outcome, the target moved back to the served one: settle with it",
        ref(5),
        serving(5),
        buffers(staged(5), staged(6), A, B),
        None,
        True,
        Step(StepKind.SETTLE, A),
    ),
    (
        "unknown outcome, the handed buffer unusable: settle with the served one",
        ref(7),
        serving(5),
        buffers(staged(5), None, A, B),
        None,
        True,
        Step(StepKind.SETTLE, A),
    ),
    (
        "unknown outcome, nothing served: settle with the handed one",
        ref(7),
        None,
        buffers(None, staged(6), None, B),
        None,
        True,
        Step(StepKind.SETTLE, B),
    ),
    (
        "handed buffer unusable, nothing served: build elsewhere",
        ref(7),
        None,
        buffers(None, None, None, B),
        None,
        True,
        Step(StepKind.BUILD, A, ref(7)),
    ),
    (
        "engine restarted: reload the served buffer",
        ref(6),
        None,
        buffers(staged(5), served=A),
        None,
        True,
        Step(StepKind.RELOAD, A),
    ),
    (
        "engine restarted, no target: still reload",
        None,
        None,
        buffers(staged(5), served=A),
        None,
        True,
        Step(StepKind.RELOAD, A),
    ),
    (
        "restart while Failed: reload before holding",
        ref(6),
        None,
        buffers(staged(5), served=A),
        Hold(ref(6), r.CHECKSUM_MISMATCH, "", "s6"),
        True,
        Step(StepKind.RELOAD, A),
    ),
    ("no target", None, serving(5), buffers(staged(5), served=A), None, True, Step(StepKind.IDLE)),
    (
        "at the target",
        ref(5),
        serving(5),
        buffers(staged(5), served=A),
        None,
        True,
        Step(StepKind.READY, A, ref(5)),
    ),
    (
        "failed target holds",
        ref(6),
        serving(5),
        buffers(staged(5), served=A),
        Hold(ref(6), r.CHECKSUM_MISMATCH, "", "s6"),
        True,
        Step(StepKind.HOLD, target=ref(6)),
    ),
    (
        "corrected step is a new target",
        ref(7, identity="s6"),
        serving(5),
        buffers(staged(5), served=A),
        Hold(ref(6), r.MANIFEST_INVALID, "", "s6"),
        True,
        Step(StepKind.BUILD, B, ref(7, identity="s6")),
    ),
    (
        "same identity, other step: not Ready",
        ref(6, identity="s5"),
        serving(5),
        buffers(staged(5), served=A),
        None,
        True,
        Step(StepKind.BUILD, B, ref(6, identity="s5")),
    ),
    (
        "target built, swap refused busy: swap again",
        ref(6),
        serving(5),
        buffers(staged(5), staged(6), served=A),
        None,
        True,
        Step(StepKind.SWAP, B, ref(6)),
    ),
    (
        "build into the free buffer",
        ref(6),
        serving(5),
        buffers(staged(5), staged(4), served=A),
        None,
        True,
        Step(StepKind.BUILD, B, ref(6)),
    ),
    (
        "served in B: build into A",
        ref(6),
        serving(5, B),
        buffers(staged(4), staged(5), served=B),
        None,
        True,
        Step(StepKind.BUILD, A, ref(6)),
    ),
    (
        "first load: empty buffers",
        ref(0, FULL),
        None,
        buffers(),
        None,
        True,
        Step(StepKind.BUILD, A, ref(0, FULL)),
    ),
    (
        "nothing served, B has content to patch",
        ref(6),
        None,
        buffers(None, staged(4)),
        None,
        True,
        Step(StepKind.BUILD, B, ref(6)),
    ),
    (
        "adopted unstaged snapshot: any buffer is free",
        ref(6),
        serving(5, None),
        buffers(staged(3), staged(4)),
        None,
        True,
        Step(StepKind.BUILD, A, ref(6)),
    ),
]


@pytest.mark.parametrize(
    ("target", "serving_", "buffers_", "hold", "answers", "expected"),
    [row[1:] for row in NEXT],
    ids=[row[0] for row in NEXT],
)
def test_next_step(
    target: SnapshotRef | None,
    serving_: Serving | None,
    buffers_: Buffers,
    hold: Hold | None,
    answers: bool,
    expected: Step,
) -> None:
    assert next_step(target, serving_, buffers_, hold, engine_answers=answers) == expected


def test_a_buffer_the_engine_may_read_is_never_the_one_built_into() -> None:
    for served in (A, B, None):
        for handed in (A, B, None):
            if served is not None and served == handed:
                continue
            state = buffers(staged(1), staged(2), served=served, handed=handed)
            step = next_step(ref(9), serving(1, served), state, None, engine_answers=True)
            if step.kind is StepKind.BUILD:
                assert step.slot not in (served, handed)


# --- choose_build -----------------------------------------------------------------------


def plan(via: LoadPath, *steps: int) -> UpdatePlan:
    return UpdatePlan(via, tuple(f"s{s}" for s in steps), 0)


REPLAY = plan(LoadPath.REPLAY, 0, 1, 2, 3, 4, 5, 6)

BUILDS = [
    # (name, in_place, from_served, fresh, base, via)
    (
        "free buffer one behind: patch it",
        plan(LoadPath.DELTA, 5, 6),
        plan(LoadPath.DELTA, 6),
        False,
        Base.IN_PLACE,
        LoadPath.DELTA,
    ),
    (
        "free buffer far behind: from served",
        plan(LoadPath.DELTA, 3, 4, 5, 6),
        plan(LoadPath.DELTA, 6),
        False,
        Base.FROM_SERVED,
        LoadPath.DELTA,
    ),
    (
        "free buffer off the chain: from served",
        REPLAY,
        plan(LoadPath.DELTA, 6),
        False,
        Base.FROM_SERVED,
        LoadPath.DELTA,
    ),
    (
        "free buffer empty, served on chain",
        None,
        plan(LoadPath.DELTA, 6),
        False,
        Base.FROM_SERVED,
        LoadPath.DELTA,
    ),
    (
        "nothing served, free buffer on chain",
        plan(LoadPath.DELTA, 5, 6),
        None,
        False,
        Base.IN_PLACE,
        LoadPath.DELTA,
    ),
    ("neither on the chain: replay", REPLAY, REPLAY, False, Base.EMPTY, LoadPath.REPLAY),
    (
        "fresh after a break: replay from nothing",
        plan(LoadPath.DELTA, 6),
        plan(LoadPath.DELTA, 6),
        True,
        Base.EMPTY,
        LoadPath.REPLAY,
    ),
]


@pytest.mark.parametrize(
    ("in_place", "from_served", "fresh", "base", "via"),
    [row[1:] for row in BUILDS],
    ids=[row[0] for row in BUILDS],
)
def test_choose_build(
    in_place: UpdatePlan | None,
    from_served: UpdatePlan | None,
    fresh: bool,
    base: Base,
    via: LoadPath,
) -> None:
    choice = choose_build(BuildOptions(in_place, from_served, REPLAY), fresh=fresh)
    assert (choice.base, choice.plan.via) == (base, via)


# --- after_failure ----------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    action: Action
    reason: str
    weights_unknown: bool = False
    outcome_unknown: bool = False
    abandon_buffer: bool = False


FAILURES = [
    # (name, failure, attempts, rollback_trusted, expect)
    (
        "transient storage: retry",
        Failure(r.STORAGE_UNAVAILABLE, Job.BUILD),
        Attempts(3),
        True,
        Expect(Action.RETRY, r.STORAGE_UNAVAILABLE),
    ),
    (
        "late file: retry",
        Failure(r.NOT_FOUND, Job.BUILD),
        Attempts(40),
        True,
        Expect(Action.RETRY, r.NOT_FOUND),
    ),
    (
        "checksum: replay fetched again first",
        Failure(r.CHECKSUM_MISMATCH, Job.BUILD),
        Attempts(),
        True,
        Expect(Action.RETRY_FRESH, r.CHECKSUM_MISMATCH),
    ),
    (
        "checksum on the fresh replay: report",
        Failure(r.CHECKSUM_MISMATCH, Job.BUILD, fresh=True),
        Attempts(),
        True,
        Expect(Action.FAIL, r.CHECKSUM_MISMATCH),
    ),
    (
        "chain broken on the fresh replay",
        Failure(r.CHAIN_BROKEN, Job.BUILD, fresh=True),
        Attempts(),
        True,
        Expect(Action.FAIL, r.CHAIN_BROKEN),
    ),
    (
        "access denied: fail at once",
        Failure(r.ACCESS_DENIED, Job.BUILD),
        Attempts(),
        True,
        Expect(Action.FAIL, r.ACCESS_DENIED),
    ),
    (
        "bug in a build: transient below the cap",
        Failure("FileNotFoundError", Job.BUILD, expected=False),
        Attempts(0, 3),
        True,
        Expect(Action.RETRY, r.INTERNAL_ERROR),
    ),
    (
        "bug in a build at the cap: InternalError",
        Failure("FileNotFoundError", Job.BUILD, expected=False),
        Attempts(0, 4),
        True,
        Expect(Action.FAIL, r.INTERNAL_ERROR),
    ),
    (
        "engine busy on the swap: swap again",
        Failure(r.ENGINE_BUSY, Job.SWAP),
        Attempts(),
        False,
        Expect(Action.RETRY, r.ENGINE_BUSY),
    ),
    (
        "refused by a trusted engine",
        Failure(r.ENGINE_REJECTED, Job.SWAP),
        Attempts(),
        True,
        Expect(Action.FAIL, r.ENGINE_REJECTED),
    ),
    (
        "refused by an untrusted engine: reload",
        Failure(r.ENGINE_REJECTED, Job.SWAP),
        Attempts(),
        False,
        Expect(Action.FAIL, r.ENGINE_REJECTED, weights_unknown=True),
    ),
    (
        "swap timed out: settle next",
        Failure(r.ENGINE_UNAVAILABLE, Job.SWAP, outcome_known=False),
        Attempts(),
        True,
        Expect(Action.RETRY, r.ENGINE_UNAVAILABLE, outcome_unknown=True),
    ),
    (
        "server error mid-swap: settle next",
        Failure(r.ENGINE_ERROR, Job.SWAP, outcome_known=False),
        Attempts(),
        True,
        Expect(Action.RETRY, r.ENGINE_ERROR, outcome_unknown=True),
    ),
    (
        "server errors to the cap: give the load up",
        Failure(r.ENGINE_ERROR, Job.SWAP, outcome_known=False),
        Attempts(0, 4),
        True,
        Expect(Action.FAIL, r.ENGINE_ERROR, weights_unknown=True),
    ),
    (
        "digest differs after the swap: reload, retry",
        Failure(r.DIGEST_MISMATCH, Job.SWAP),
        Attempts(),
        True,
        Expect(Action.RETRY, r.DIGEST_MISMATCH, weights_unknown=True),
    ),
    (
        "digest differs to the cap",
        Failure(r.DIGEST_MISMATCH, Job.SWAP),
        Attempts(0, 4),
        True,
        Expect(Action.FAIL, r.DIGEST_MISMATCH, weights_unknown=True),
    ),
    (
        "reload busy: retry",
        Failure(r.ENGINE_BUSY, Job.RELOAD),
        Attempts(),
        True,
        Expect(Action.RETRY, r.ENGINE_BUSY),
    ),
    (
        "reload refused to the cap: abandon the buffer",
        Failure(r.ENGINE_REJECTED, Job.RELOAD),
        Attempts(0, 4),
        True,
        Expect(Action.FAIL, r.ENGINE_REJECTED, abandon_buffer=True),
    ),
    (
        "reload refused once: retry",
        Failure(r.ENGINE_REJECTED, Job.RELOAD),
        Attempts(),
        True,
        Expect(Action.RETRY, r.ENGINE_REJECTED),
    ),
    (
        "drain cannot break a chain but can be a bug",
        Failure("RuntimeError", Job.DRAIN, expected=False),
        Attempts(),
        True,
        Expect(Action.RETRY, r.INTERNAL_ERROR),
    ),
]


@pytest.mark.parametrize(
    ("failure", "attempts", "trusted", "expect"),
    [row[1:] for row in FAILURES],
    ids=[row[0] for row in FAILURES],
)
def test_after_failure(failure: Failure, attempts: Attempts, trusted: bool, expect: Expect) -> None:
    decision = after_failure(failure, attempts, rollback_trusted=trusted)
    got = Expect(
        decision.action,
        decision.reason,
        decision.weights_unknown,
        decision.outcome_unknown,
        decision.abandon_buffer,
    )
    assert got == expect


def test_backoff_attempt_counts_the_right_failures() -> None:
    transient = after_failure(
        Failure(r.NOT_FOUND, Job.BUILD), Attempts(7, 2), rollback_trusted=True
    )
    assert (transient.backoff_attempt, transient.counted) == (7, False)
    bug = after_failure(
        Failure("KeyError", Job.BUILD, expected=False), Attempts(7, 2), rollback_trusted=True
    )
    assert (bug.backoff_attempt, bug.counted) == (2, True)


# --- should_preempt ---------------------------------------------------------------------

PREEMPT = [
    # (name, job, working_on, target, engine_lost, preempt)
    ("newer target while building", Job.BUILD, ref(6), ref(7), False, True),
    ("newer target while draining", Job.DRAIN, ref(6), ref(7), False, True),
    ("newer target while swapping: never", Job.SWAP, ref(6), ref(7), False, False),
    ("reloading: never", Job.RELOAD, ref(6), ref(7), False, False),
    ("same target", Job.BUILD, ref(6), ref(6), False, False),
    ("target corrected in its step", Job.BUILD, ref(6), ref(8, identity="s6"), False, True),
    (
        "only the cache policy changed",
        Job.BUILD,
        ref(6),
        ref(6).model_copy(update={"kv_cache_policy": KvCachePolicy.NONE}),
        False,
        False,
    ),
    ("target removed", Job.BUILD, ref(6), None, False, True),
    ("engine restarted while building", Job.BUILD, ref(6), ref(6), True, True),
    (
        "engine restarted while draining: the swap reloads it",
        Job.DRAIN,
        ref(6),
        ref(6),
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("job", "working_on", "target", "lost", "preempt"),
    [row[1:] for row in PREEMPT],
    ids=[row[0] for row in PREEMPT],
)
def test_should_preempt(
    job: Job, working_on: SnapshotRef, target: SnapshotRef | None, lost: bool, preempt: bool
) -> None:
    assert should_preempt(job, working_on, target, engine_lost=lost) is preempt


# --- replica_state ----------------------------------------------------------------------

STATES = [
    ("at the target", ref(5), serving(5), None, ReplicaState.READY),
    ("behind the target", ref(6), serving(5), None, ReplicaState.LOADING),
    ("nothing verified served", ref(5), None, None, ReplicaState.LOADING),
    (
        "failed target",
        ref(6),
        serving(5),
        Hold(ref(6), r.CHECKSUM_MISMATCH, "", "s6"),
        ReplicaState.FAILED,
    ),
    (
        "old hold, new target",
        ref(7),
        serving(5),
        Hold(ref(6), r.CHECKSUM_MISMATCH, "", "s6"),
        ReplicaState.LOADING,
    ),
    ("no target, serving", None, serving(5), None, ReplicaState.READY),
    ("no target, nothing", None, None, None, None),
]


@pytest.mark.parametrize(
    ("target", "serving_", "hold", "state"),
    [row[1:] for row in STATES],
    ids=[row[0] for row in STATES],
)
def test_replica_state(
    target: SnapshotRef | None,
    serving_: Serving | None,
    hold: Hold | None,
    state: ReplicaState | None,
) -> None:
    assert replica_state(target, serving_, hold) is state


def test_a_target_is_identity_step_and_kind() -> None:
    assert same_snapshot(ref(5), staged(5))
    assert not same_snapshot(ref(5), ref(6, identity="s5"))
    assert not same_snapshot(ref(5, FULL), staged(5, DELTA))
    assert not same_snapshot(ref(5), None)


def test_after_a_sidecar_restart_a_pending_load_keeps_its_buffer_in_use() -> None:
    """The engine still serves the old snapshot while a handed load may be pending: the
    old one is adopted, the handed buffer stays untouchable and is settled first."""
    state = buffers(staged(5), staged(6), served=A, handed=B)
    judgement = judge_engine(None, report("s5"), state)
    assert (judgement.verdict, judgement.slot) == (Verdict.ADOPT, A)
    adopted = Buffers(state.contents, served=A, handed=B)
    step = next_step(ref(7), serving(5), adopted, None, engine_answers=True)
    assert step == Step(StepKind.SETTLE, B), "never built into B; settled by loading it"


# --- never back to a snapshot the engine left -----------------------------------------
#
# The cross-region e2e once answered a completion on step 1 then step 3, after step 3
# was Ready: the engine had been taken back to the older served buffer. Each row is a
# way in; the answer must never be a load of the older buffer.

UNCONFIRMED = [
    # (name, target, serving, buffers, engine_unconfirmed, expected)
    (
        # A restarted sidecar (or a patch whose answer was lost): the engine names s6,
        # patched in place; the served buffer still holds s5 (catch-up not done); the
        # bucket did not answer the manifest check yet.
        "the engine names the target, check pending: wait for the check",
        ref(6),
        None,
        buffers(staged(5), served=A),
        "s6",
        Step(StepKind.CONFIRM, target=ref(6)),
    ),
    (
        "the engine names a snapshot, no target, check pending: wait",
        None,
        None,
        buffers(staged(5), served=A),
        "s6",
        Step(StepKind.CONFIRM),
    ),
    (
        "the engine names an older target's successor; a newer target is built, not s5",
        ref(7),
        None,
        buffers(staged(5), served=A),
        "s6",
        Step(StepKind.BUILD, B, ref(7)),
    ),
    (
        "check concluded (nothing pending): the served buffer is reloaded",
        ref(6),
        None,
        buffers(staged(5), served=A),
        None,
        Step(StepKind.RELOAD, A),
    ),
    (
        "a handed load of unknown outcome settles forward even while a check is pending",
        ref(6),
        None,
        buffers(staged(5), staged(6), A, B),
        "s6",
        Step(StepKind.SETTLE, B),
    ),
]


@pytest.mark.parametrize(
    ("target", "serving_", "buffers_", "unconfirmed", "expected"),
    [row[1:] for row in UNCONFIRMED],
    ids=[row[0] for row in UNCONFIRMED],
)
def test_nothing_older_is_loaded_over_a_snapshot_being_checked(
    target: SnapshotRef | None,
    serving_: Serving | None,
    buffers_: Buffers,
    unconfirmed: str | None,
    expected: Step,
) -> None:
    step = next_step(
        target, serving_, buffers_, None, engine_answers=True, engine_unconfirmed=unconfirmed
    )
    assert step == expected


def test_a_patch_whose_answer_was_lost_is_adopted_not_reloaded_over() -> None:
    """In place s5 -> s6, the answer lost: the pod still says s5, the engine names s6 with
    s6's digest. The pod drops s5 at once (LOST); judged again with nothing served, the
    engine's s6 is a snapshot to check (ADOPT_UNSTAGED, never a reload of s5); once a
    buffer holds s6 verified it is adopted from it."""
    state = buffers(staged(5), served=A)
    lost = judge_engine(serving(5, slot=A), report("s6", digest="d6"), state)
    assert lost.verdict is Verdict.LOST
    again = judge_engine(None, report("s6", digest="d6"), state)
    assert (again.verdict, again.identity) == (Verdict.ADOPT_UNSTAGED, "s6")
    pending = next_step(
        ref(6), None, state, None, engine_answers=True, engine_unconfirmed=again.identity
    )
    assert pending.kind is StepKind.CONFIRM
    caught_up = buffers(staged(5), staged(6), served=A)
    adopt = judge_engine(None, report("s6", digest="d6"), caught_up)
    assert (adopt.verdict, adopt.slot) == (Verdict.ADOPT, B)


def test_no_situation_loads_an_older_buffer_over_a_newer_snapshot_the_engine_names() -> None:
    """Exhaustive over small states: while the engine names s6 (served and confirmed, or
    pending its check) and a buffer holds the older s5, no step loads s5. (A handed
    buffer holding s5 is left out: s5 was then handed after s6 was served, which only a
    target moved back to s5 does — a rollback the operator asked for.)"""
    contents = [None, staged(5), staged(6)]
    for a in contents:
        for b in contents:
            for served in (A, B, None):
                for handed in (A, B, None):
                    if served is not None and served == handed:
                        continue
                    state = buffers(a, b, served, handed)
                    if same_snapshot(state.held(handed), staged(5)):
                        continue
                    for target in (ref(6), ref(7), None):
                        for serving_, pending in ((serving(6, slot=None), None), (None, "s6")):
                            step = next_step(
                                target,
                                serving_,
                                state,
                                None,
                                engine_answers=True,
                                engine_unconfirmed=pending,
                            )
                            loads = step.kind in (StepKind.SETTLE, StepKind.RELOAD)
                            older = loads and same_snapshot(state.held(step.slot), staged(5))
                            assert not older, (state, target, serving_, pending, step)


# --- a target moved back by another writer --------------------------------------------

BACKWARD = [
    # (name, target, serving, status.rollback.toIdentity, refused)
    ("forward is followed", ref(5), serving(4), None, False),
    ("the served target is followed", ref(4), serving(4), None, False),
    ("back by hand is refused", ref(3), serving(4), None, True),
    ("back to what the operator's rollback names is followed", ref(3), serving(4), "s3", False),
    ("back past the operator's rollback is refused", ref(2), serving(4), "s3", True),
    ("a delta of a served Full's step is behind it", ref(4), serving(4, kind=FULL), None, True),
    ("a replica serving nothing follows any target", ref(1), None, None, False),
    ("no target, nothing to refuse", None, serving(4), None, False),
]


@pytest.mark.parametrize(
    ("target", "served", "rolled_back_to", "refused"),
    [case[1:] for case in BACKWARD],
    ids=[case[0] for case in BACKWARD],
)
def test_unconfirmed_backward(
    target: SnapshotRef | None, served: Serving | None, rolled_back_to: str | None, refused: bool
) -> None:
    """Would catch (issue 22, finding 4): engines loading an older snapshot because another
    writer moved the target back, before the operator repairs it."""
    assert unconfirmed_backward(target, served, rolled_back_to) is refused


def test_only_a_digest_equal_to_the_snapshots_is_reported_as_verified() -> None:
    assert confirms_digest("ab", "ab")
    assert not confirms_digest("ab", "cd")
    assert not confirms_digest(None, "ab")
