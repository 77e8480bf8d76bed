"""A load nobody announced, a foreign pause and an old target's error: the pure rules.

Issue 22, findings 6 and 9. Would catch: a load under the served name taken as ours
(the check looked at the name and the instance only), a foreign load accepted on the
label of an engine that offers no digest, a new generation never remembered (every look
after a verified foreign load a new alarm), a paused engine never owed a resume, and
``lastError`` still naming a failure of a target long gone.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hotload.api import KvCachePolicy, LoadPath, SnapshotKind, SnapshotRef
from hotload.engines.protocol import EngineReport
from hotload.sidecar.memory import Memory, Observation, fold, loses_serving
from hotload.sidecar.planning import (
    Buffers,
    Serving,
    Slot,
    Verdict,
    foreign_load_verified,
    judge_engine,
)
from hotload.sidecar.status import EngineSeen, ErrorRecord, current_error

DELTA = SnapshotKind.INCREMENTAL
SERVING = Serving("s2", 2, DELTA, LoadPath.DELTA, Slot.A, "i1", digest="d2", generation="5")
BUFFERS = Buffers({Slot.A: None, Slot.B: None}, served=Slot.A)
SEEN = EngineSeen(identity="s2", instance_id="i1", answered=True, at=datetime.now(UTC))


def report(generation: str | None, digest: str | None = None, identity: str = "s2") -> EngineReport:
    return EngineReport(identity, "i1", digest, generation=generation)


@pytest.mark.parametrize(
    ("serving", "seen", "verdict"),
    [
        (SERVING, report("5"), Verdict.CONSISTENT),
        (SERVING, report("6"), Verdict.FOREIGN_LOAD),
        # An engine that offers no generation (vLLM), or a serving confirmed without one.
        (SERVING, report(None), Verdict.CONSISTENT),
        (Serving("s2", 2, DELTA, LoadPath.DELTA, Slot.A, "i1"), report("6"), Verdict.CONSISTENT),
        # Another name is lost whatever the generation says.
        (SERVING, report("6", identity="s9"), Verdict.LOST),
    ],
    ids=["same", "moved", "engine-has-none", "confirmed-without", "other-name"],
)
def test_a_generation_that_moved_under_the_served_name_is_a_foreign_load(
    serving: Serving, seen: EngineReport, verdict: Verdict
) -> None:
    assert judge_engine(serving, seen, BUFFERS).verdict is verdict


@pytest.mark.parametrize(
    ("digest", "verified"),
    [("d2", True), ("d9", False), (None, False)],
    ids=["same-weights", "other-weights", "no-digest"],
)
def test_only_the_engine_s_digest_proves_a_foreign_load_left_our_weights(
    digest: str | None, verified: bool
) -> None:
    assert foreign_load_verified(SERVING, report("6", digest)) is verified


def test_a_foreign_load_without_proof_drops_the_snapshot_and_distrusts_the_label() -> None:
    lost = Observation(SEEN, True, lost=True, again=True, unverified=True)
    assert loses_serving(lost)
    memory = fold(Memory(serving=SERVING), lost)
    assert memory.serving is None and memory.weights_unknown
    # With weights unknown nothing is adopted from the label: the served buffer reloads.
    assert judge_engine(None, report("6"), BUFFERS, weights_unknown=True).verdict is (Verdict.EMPTY)


def test_a_verified_foreign_load_is_remembered_at_its_new_generation() -> None:
    memory = fold(Memory(serving=SERVING), Observation(SEEN, True, regenerated="6"))
    assert memory.serving is not None and memory.serving.generation == "6"
    assert judge_engine(memory.serving, report("6"), BUFFERS).verdict is Verdict.CONSISTENT


def test_a_paused_engine_is_owed_a_resume() -> None:
    memory = fold(Memory(resume_owed=False), Observation(SEEN, True, paused=True))
    assert memory.resume_owed
    assert not fold(Memory(resume_owed=False), Observation(SEEN, True)).resume_owed


def _ref(identity: str) -> SnapshotRef:
    return SnapshotRef(identity=identity, step=1, kind=DELTA, kv_cache_policy=KvCachePolicy.ALL)


def test_last_error_concerns_the_target_now() -> None:
    error = ErrorRecord(
        reason="NotFound", message="m", transient=True, target="s2", at=datetime.now(UTC)
    )
    assert current_error(error, _ref("s2")) is error
    assert current_error(error, _ref("s3")) is None
    assert current_error(error, None) is error
    assert current_error(None, _ref("s2")) is None
