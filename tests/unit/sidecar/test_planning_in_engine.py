"""The planner's decisions for deltas patched in the engine, and staging catching up."""

from __future__ import annotations

import pytest

from hotload.api import KvCachePolicy, LoadPath, ReplicaState, SnapshotKind, SnapshotRef
from hotload.api import reasons as r
from hotload.sidecar.planning import (
    Action,
    Attempts,
    Buffers,
    Failure,
    Job,
    Route,
    Serving,
    Slot,
    Staged,
    Step,
    StepKind,
    after_failure,
    choose_route,
    next_step,
    replica_state,
    should_preempt,
    staged_behind,
)
from hotload.snapshot import UpdatePlan

A, B = Slot.A, Slot.B
FULL, DELTA = SnapshotKind.FULL, SnapshotKind.INCREMENTAL


def ref(step: int, kind: SnapshotKind = DELTA) -> SnapshotRef:
    return SnapshotRef(identity=f"s{step}", step=step, kind=kind, kv_cache_policy=KvCachePolicy.ALL)


def staged(step: int) -> Staged:
    return Staged(f"s{step}", step, DELTA, f"d{step}")


def serving(step: int, slot: Slot | None = A) -> Serving:
    return Serving(f"s{step}", step, DELTA, LoadPath.DELTA, slot, "i1")


def plan(via: LoadPath, *steps: int) -> UpdatePlan:
    return UpdatePlan(via, tuple(f"s{step}" for step in steps), 100)


# --- choose_route ---------------------------------------------------------------------

ROUTES = [
    # (name, target, serving, plan from serving, patches, fresh, refused, route)
    (
        "one delta from what the engine serves: patch in the engine",
        ref(6),
        serving(5),
        plan(LoadPath.DELTA, 6),
        True,
        False,
        None,
        Route.IN_ENGINE,
    ),
    (
        "served after an in-place patch (no buffer holds it): patch again",
        ref(7),
        serving(6, None),
        plan(LoadPath.DELTA, 7),
        True,
        False,
        None,
        Route.IN_ENGINE,
    ),
    (
        "an engine that cannot patch in place loads a directory",
        ref(6),
        serving(5),
        plan(LoadPath.DELTA, 6),
        False,
        False,
        None,
        Route.DIRECTORY,
    ),
    (
        "two deltas behind: rebuild and load",
        ref(7),
        serving(5),
        plan(LoadPath.DELTA, 6, 7),
        True,
        False,
        None,
        Route.DIRECTORY,
    ),
    (
        "nothing confirmed served (restart, weights unknown): directory",
        ref(6),
        None,
        None,
        True,
        False,
        None,
        Route.DIRECTORY,
    ),
    (
        "a Full target is loaded",
        ref(6, FULL),
        serving(5),
        plan(LoadPath.FULL, 6),
        True,
        False,
        None,
        Route.DIRECTORY,
    ),
    (
        "a fresh replay reads the bucket again: directory",
        ref(6),
        serving(5),
        plan(LoadPath.DELTA, 6),
        True,
        True,
        None,
        Route.DIRECTORY,
    ),
    (
        "the engine refused this target: fall back to the directory",
        ref(6),
        serving(5),
        plan(LoadPath.DELTA, 6),
        True,
        False,
        ref(6),
        Route.DIRECTORY,
    ),
    (
        "a refusal of an earlier target does not stick",
        ref(7),
        serving(6),
        plan(LoadPath.DELTA, 7),
        True,
        False,
        ref(6),
        Route.IN_ENGINE,
    ),
    (
        "the engine serves a snapshot off the target's chain: replay",
        ref(6),
        serving(5),
        plan(LoadPath.REPLAY, 0, 6),
        True,
        False,
        None,
        Route.DIRECTORY,
    ),
    (
        "already served (empty plan): nothing to patch",
        ref(5),
        serving(5),
        plan(LoadPath.DELTA),
        True,
        False,
        None,
        Route.DIRECTORY,
    ),
]


@pytest.mark.parametrize(
    ("target", "serving_", "plan_", "patches", "fresh", "refused", "expected"),
    [row[1:] for row in ROUTES],
    ids=[str(row[0]) for row in ROUTES],
)
def test_choose_route(
    target: SnapshotRef,
    serving_: Serving | None,
    plan_: UpdatePlan | None,
    patches: bool,
    fresh: bool,
    refused: SnapshotRef | None,
    expected: Route,
) -> None:
    route = choose_route(
        target, serving_, plan_, patches_in_place=patches, fresh=fresh, refused=refused
    )
    assert route is expected


# --- next_step: catching staging up ------------------------------------------------------

CATCH_UP = [
    # (name, target, serving, buffers, given up, step)
    (
        "patched in the engine: the served buffer holds the previous snapshot",
        ref(6),
        serving(6, None),
        Buffers({A: staged(5), B: staged(4)}, served=A),
        None,
        Step(StepKind.CATCH_UP, B, ref(6)),
    ),
    (
        "adopted after a sidecar restart, nothing staged",
        ref(6),
        serving(6, None),
        Buffers({A: None, B: None}),
        None,
        Step(StepKind.CATCH_UP, A, ref(6)),
    ),
    (
        "caught up: Ready",
        ref(6),
        serving(6, B),
        Buffers({A: staged(5), B: staged(6)}, served=B),
        None,
        Step(StepKind.READY, B, ref(6)),
    ),
    (
        "catch-up given up for this snapshot: Ready as it is",
        ref(6),
        serving(6, None),
        Buffers({A: staged(5), B: None}, served=A),
        ref(6),
        Step(StepKind.READY, None, ref(6)),
    ),
    (
        "given up for an older snapshot: the new one catches up",
        ref(7),
        serving(7, None),
        Buffers({A: staged(5), B: None}, served=A),
        ref(6),
        Step(StepKind.CATCH_UP, B, ref(7)),
    ),
    (
        "a new target while staging lags: bring the target first",
        ref(7),
        serving(6, None),
        Buffers({A: staged(5), B: staged(4)}, served=A),
        None,
        Step(StepKind.BUILD, B, ref(7)),
    ),
    (
        "engine restarted before staging caught up: reload the served buffer",
        ref(6),
        None,
        Buffers({A: staged(5), B: staged(4)}, served=A),
        None,
        Step(StepKind.RELOAD, A),
    ),
    (
        "a load of unknown outcome is settled before any catch-up",
        ref(7),
        serving(6, None),
        Buffers({A: staged(5), B: staged(7)}, served=A, handed=B),
        None,
        Step(StepKind.SETTLE, B),
    ),
    (
        # Settling with s5 or s4 would take the engine back from s6, which it serves
        # confirmed: neither is loaded, the handed buffer stays untouched.
        "no settle goes behind the snapshot the engine serves",
        ref(6),
        serving(6, None),
        Buffers({A: staged(5), B: staged(4)}, served=A, handed=B),
        None,
        Step(StepKind.READY, None, ref(6)),
    ),
]


@pytest.mark.parametrize(
    ("target", "serving_", "buffers_", "given_up", "expected"),
    [row[1:] for row in CATCH_UP],
    ids=[str(row[0]) for row in CATCH_UP],
)
def test_next_step_catches_staging_up(
    target: SnapshotRef,
    serving_: Serving | None,
    buffers_: Buffers,
    given_up: SnapshotRef | None,
    expected: Step,
) -> None:
    step = next_step(
        target, serving_, buffers_, None, engine_answers=True, catch_up_given_up=given_up
    )
    assert step == expected


def test_a_catch_up_never_writes_a_buffer_the_engine_may_read() -> None:
    for served in (A, B, None):
        for handed in (A, B, None):
            if served is not None and served == handed:
                continue
            state = Buffers({A: staged(4), B: staged(5)}, served=served, handed=handed)
            step = next_step(ref(6), serving(6, None), state, None, engine_answers=True)
            if step.kind is StepKind.CATCH_UP:
                assert step.slot not in (served, handed)


def test_a_replica_whose_staging_lags_is_ready() -> None:
    """The pod says what the engine serves: staging catching up does not change it."""
    assert staged_behind(serving(6, None), Buffers({A: staged(5), B: None}, served=A))
    assert replica_state(ref(6), serving(6, None), None) is ReplicaState.READY


# --- failures and preemption of a catch-up ---------------------------------------------

CATCH_UP_FAILURES = [
    # (name, reason, expected, action)
    ("a storage outage is retried", r.STORAGE_UNAVAILABLE, True, Action.RETRY),
    ("the engine not answering is retried", r.ENGINE_UNAVAILABLE, True, Action.RETRY),
    (
        "a corrupt copy is replayed from the bucket (the replica stays Ready)",
        r.CHECKSUM_MISMATCH,
        True,
        Action.RETRY_FRESH,
    ),
    ("a digest mismatch gives up", r.DIGEST_MISMATCH, True, Action.GIVE_UP),
    ("a bug gives up", "Whatever", False, Action.GIVE_UP),
]


@pytest.mark.parametrize(
    ("reason", "expected", "action"),
    [row[1:] for row in CATCH_UP_FAILURES],
    ids=[row[0] for row in CATCH_UP_FAILURES],
)
def test_a_failed_catch_up_never_fails_the_replica(
    reason: str, expected: bool, action: Action
) -> None:
    decision = after_failure(
        Failure(reason, Job.CATCH_UP, expected=expected), Attempts(), rollback_trusted=True
    )
    assert decision.action is action
    assert not decision.weights_unknown and not decision.outcome_unknown


def test_a_catch_up_replayed_afresh_that_fails_again_gives_up() -> None:
    failure = Failure(r.CHECKSUM_MISMATCH, Job.CATCH_UP, fresh=True)
    assert after_failure(failure, Attempts(), rollback_trusted=True).action is Action.GIVE_UP


def test_a_catch_up_is_preempted_by_a_new_target_or_a_lost_engine() -> None:
    assert should_preempt(Job.CATCH_UP, ref(6), ref(7), engine_lost=False)
    assert should_preempt(Job.CATCH_UP, ref(6), ref(6), engine_lost=True)
    assert not should_preempt(Job.CATCH_UP, ref(6), ref(6), engine_lost=False)
