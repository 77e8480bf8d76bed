"""The agent's memory changes only by folding facts: each fold, as a table of cases.

Would catch: a confirmed swap that leaves the target's old failure holding the replica
Failed, or its attempts counting against the next target; a retry that forgets when it
is due; an unusable handed buffer that reads as loadable again; a new target that keeps
the old one's attempts (or an unchanged target that loses its own).
"""

from __future__ import annotations

from dataclasses import replace

from hotload.api import KvCachePolicy, LoadPath, SnapshotKind, SnapshotRef
from hotload.sidecar.memory import (
    AtTarget,
    BuffersRead,
    CaughtUp,
    Failed,
    Memory,
    Observation,
    RetryDue,
    Served,
    Swapped,
    TargetSeen,
    Unusable,
    WeightsLost,
    fold,
    loses_serving,
    sets_serving,
)
from hotload.sidecar.planning import (
    Action,
    Attempts,
    Buffers,
    FailureDecision,
    Hold,
    Serving,
    Slot,
    Staged,
)
from hotload.sidecar.status import EngineSeen, now_utc


def ref(identity: str, step: int) -> SnapshotRef:
    kind = SnapshotKind.FULL if step == 0 else SnapshotKind.INCREMENTAL
    return SnapshotRef(identity=identity, step=step, kind=kind, kv_cache_policy=KvCachePolicy.ALL)


def staged(identity: str, step: int) -> Staged:
    kind = SnapshotKind.FULL if step == 0 else SnapshotKind.INCREMENTAL
    return Staged(identity, step, kind, f"digest-{identity}")


SEEN = EngineSeen(identity="s1", instance_id="i", answered=True, at=now_utc())


def test_a_confirmed_swap_serves_the_target_and_forgets_its_failures() -> None:
    held = Hold(ref("s2", 2), "EngineBusy", "busy", "s2")
    memory = Memory(hold=held, attempts=Attempts(3, 1), fresh=True, weights_unknown=True)
    swapped = Swapped(staged("s2", 2), LoadPath.DELTA, Slot.B, "i", ref("s2", 2), generation="7")
    memory = fold(memory, swapped)
    assert memory.serving == Serving(
        "s2", 2, SnapshotKind.INCREMENTAL, LoadPath.DELTA, Slot.B, "i", "digest-s2", "7"
    )
    assert (memory.buffers.served, memory.buffers.handed) == (Slot.B, None)
    assert memory.hold is None and memory.attempts == Attempts() and not memory.fresh
    assert not memory.weights_unknown


def test_a_reload_keeps_the_target_s_hold_and_attempts() -> None:
    held = Hold(ref("s2", 2), "EngineRejected", "no", "s2")
    memory = Memory(hold=held, attempts=Attempts(1, 0))
    memory = fold(memory, Swapped(staged("s1", 1), LoadPath.RELOAD, Slot.A, "i", None))
    assert memory.hold == held and memory.attempts == Attempts(1, 0)


def test_a_patch_in_the_engine_leaves_the_buffers_roles_alone() -> None:
    memory = Memory(buffers=Buffers({Slot.A: staged("s1", 1), Slot.B: None}, served=Slot.A))
    memory = fold(memory, Swapped(staged("s2", 2), LoadPath.DELTA, None, "i", ref("s2", 2)))
    assert memory.buffers.served is Slot.A and memory.serving is not None
    assert memory.serving.slot is None


def test_failures_count_and_decide_what_follows() -> None:
    target = ref("s2", 2)
    retry = Failed(FailureDecision(Action.RETRY, "NotFound"), target, "m", None, retry_at=7.0)
    memory = fold(Memory(), retry)
    assert memory.attempts == Attempts(transient=1) and memory.retry is not None
    assert (memory.retry.target, memory.retry.at) == (target, 7.0)
    counted = FailureDecision(Action.RETRY_FRESH, "ChecksumMismatch", counted=True)
    memory = fold(memory, Failed(counted, target, "m", "s1"))
    assert memory.fresh and memory.attempts == Attempts(transient=1, unexpected=1)
    failed = fold(memory, Failed(FailureDecision(Action.FAIL, "ChainBroken"), target, "m", "s1"))
    assert failed.hold == Hold(target, "ChainBroken", "m", "s1")
    given_up = fold(memory, Failed(FailureDecision(Action.GIVE_UP, "X"), target, "m", None))
    assert given_up.catch_up_given_up == target and given_up.hold is None
    assert fold(memory, RetryDue()).retry is None


def test_an_unusable_handed_buffer_reads_empty_until_it_is_no_longer_handed() -> None:
    both = {Slot.A: staged("s1", 1), Slot.B: staged("s2", 2)}
    memory = fold(Memory(), Unusable(Slot.B))
    memory = fold(memory, BuffersRead(Buffers(both, served=Slot.A, handed=Slot.B)))
    assert memory.buffers.held(Slot.B) is None and memory.unusable == {Slot.B}
    memory = fold(memory, BuffersRead(Buffers(both, served=Slot.A)))
    assert memory.buffers.held(Slot.B) == staged("s2", 2) and memory.unusable == frozenset()


def test_observations_drop_or_confirm_what_the_pod_serves() -> None:
    serving = Serving("s1", 1, SnapshotKind.INCREMENTAL, LoadPath.DELTA, Slot.A, "i")
    lost = Observation(SEEN, True, lost=True, again=True)
    assert loses_serving(lost) and not sets_serving(lost)
    memory = fold(Memory(serving=serving, unconfirmed="sx"), lost)
    assert memory.serving is None and memory.unconfirmed is None
    confirmed = Observation(SEEN, True, served=serving, roles=(Slot.A, None))
    assert sets_serving(confirmed)
    memory = fold(fold(memory, WeightsLost()), confirmed)
    assert memory.serving == serving and memory.buffers.served is Slot.A
    assert not memory.weights_unknown
    pending = fold(memory, Observation(SEEN, False, unconfirmed="s9", checked=("s8", "i")))
    assert not pending.engine_answers and pending.unconfirmed == "s9"
    assert pending.unstaged_checked == {("s8", "i")} and pending.serving == serving


def test_only_a_new_target_starts_its_attempts_afresh() -> None:
    memory = fold(Memory(attempts=Attempts(2, 1), fresh=True), TargetSeen(ref("s2", 2)))
    assert memory.attempts == Attempts() and memory.attempts_for == ref("s2", 2)
    again = fold(replace_attempts(memory, Attempts(1, 0)), TargetSeen(ref("s2", 2)))
    assert again.attempts == Attempts(1, 0)
    corrected = fold(replace_attempts(memory, Attempts(1, 0)), TargetSeen(ref("s2", 3)))
    assert corrected.attempts == Attempts()
    assert fold(replace_attempts(memory, Attempts(1, 0)), AtTarget()).attempts == Attempts()


def test_catching_up_makes_the_buffer_the_served_one() -> None:
    serving = Serving("s2", 2, SnapshotKind.INCREMENTAL, LoadPath.DELTA, None, "i")
    memory = fold(Memory(serving=serving, fresh=True), CaughtUp(Slot.B))
    assert memory.buffers.served is Slot.B and memory.serving is not None
    assert memory.serving.slot is Slot.B and not memory.fresh


def replace_attempts(memory: Memory, attempts: Attempts) -> Memory:
    return replace(memory, attempts=attempts)


def test_a_load_confirmed_mid_handover_serves_at_once_and_leaves_the_rest_to_the_swap() -> None:
    held = Hold(ref("s2", 2), "EngineBusy", "busy", "s2")
    memory = Memory(hold=held, attempts=Attempts(1, 0), weights_unknown=True)
    served = Served(staged("s2", 2), LoadPath.DELTA, Slot.B, "i", "7")
    assert sets_serving(served)
    memory = fold(memory, served)
    assert memory.serving == Serving(
        "s2", 2, SnapshotKind.INCREMENTAL, LoadPath.DELTA, Slot.B, "i", "digest-s2", "7"
    )
    assert not memory.weights_unknown
    assert memory.hold == held and memory.attempts == Attempts(1, 0)
    assert memory.buffers.served is None


def test_the_digest_the_engine_confirmed_is_what_the_pod_reports() -> None:
    """A swap or a confirmation mid-handover whose report carried the snapshot's digest
    marks it confirmed (the pod report's ``hotload.dev/digest``); one whose engine gave
    none leaves it unconfirmed, the digest still the snapshot's for the sidecar's checks."""
    confirmed = Served(staged("s1", 1), LoadPath.FULL, Slot.A, "i", digest_confirmed=True)
    memory = fold(Memory(), confirmed)
    assert memory.serving is not None and memory.serving.digest_confirmed
    memory = fold(memory, Swapped(staged("s2", 2), LoadPath.DELTA, Slot.B, "i", ref("s2", 2)))
    assert memory.serving is not None and not memory.serving.digest_confirmed
