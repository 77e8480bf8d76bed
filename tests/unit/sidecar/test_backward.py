"""A target another writer moved back is refused once, and held (hotload/sidecar/backward.py).

Would catch (issue 22, finding 4): engines loading an older snapshot because another writer
moved the target back, a refusal that ignores the operator's own rollback record, or one
that folds its failure on every turn (each counting another attempt).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from hotload.api import KvCachePolicy, LoadPath, RolloutDeployment, SnapshotKind, SnapshotRef
from hotload.api import reasons as r
from hotload.sidecar.backward import Refusal, refuse_backward
from hotload.sidecar.memory import Memory, fold
from hotload.sidecar.planning import Action, Hold, Serving, Slot

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def ref(step: int) -> SnapshotRef:
    return SnapshotRef(identity=f"s{step}", step=step, kind=SnapshotKind.INCREMENTAL,
                       kv_cache_policy=KvCachePolicy.ALL)  # fmt: skip


def serving(step: int) -> Serving:
    return Serving(f"s{step}", step, SnapshotKind.INCREMENTAL, LoadPath.DELTA, Slot.A, "i1")


def deployment(target: SnapshotRef, rolled_back_to: str | None = None) -> RolloutDeployment:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / "rolloutdeployment.yaml").read_text())
    status: dict[str, Any] = {"targetSnapshot": target.model_dump(mode="json", by_alias=True)}
    if rolled_back_to is not None:
        status["rollback"] = {"fromIdentity": "s4", "toIdentity": rolled_back_to,
                              "at": datetime(2026, 11, 27, tzinfo=UTC).isoformat()}  # fmt: skip
    document["status"] = status
    return RolloutDeployment.model_validate(document)


@pytest.mark.parametrize(
    ("target", "served", "rolled_back_to"),
    [
        (ref(5), serving(4), None),  # forward
        (ref(4), serving(4), None),  # the served snapshot
        (ref(3), serving(4), "s3"),  # back, as the operator's rollback record says
        (ref(1), None, None),  # serving nothing: any target is followed
    ],
)
def test_a_target_the_replica_may_follow_is_not_refused(
    target: SnapshotRef, served: Serving | None, rolled_back_to: str | None
) -> None:
    memory = Memory(serving=served)
    assert refuse_backward(deployment(target, rolled_back_to), target, memory) is None


def test_no_target_or_no_deployment_refuses_nothing() -> None:
    memory = Memory(serving=serving(4))
    assert refuse_backward(deployment(ref(3)), None, memory) is None
    assert refuse_backward(None, None, memory) is None


@pytest.mark.parametrize("rolled_back_to", [None, "s3"])
def test_a_target_moved_back_by_another_writer_fails_once_then_holds(
    rolled_back_to: str | None,
) -> None:
    """Back by hand, or back past what the operator's rollback names: Failed with
    TargetInconsistent (never a chain break) the first time, then held without folding the
    failure again."""
    target = ref(2)
    memory = Memory(serving=serving(4))
    refusal = refuse_backward(deployment(target, rolled_back_to), target, memory)
    assert refusal is not None and refusal.failed is not None
    failed = refusal.failed
    assert failed.decision.action is Action.FAIL
    assert failed.decision.reason == r.TARGET_INCONSISTENT
    assert (failed.target, failed.failed_identity) == (target, "s2")
    assert "behind the served snapshot" in failed.message
    held = fold(memory, failed)
    assert held.hold is not None and held.hold.reason == r.TARGET_INCONSISTENT
    assert refuse_backward(deployment(target, rolled_back_to), target, held) == Refusal(None)


def test_a_hold_on_another_target_does_not_stand_for_this_refusal() -> None:
    target = ref(2)
    memory = Memory(serving=serving(4), hold=Hold(ref(5), r.ENGINE_REJECTED, "rejected", "s5"))
    refusal = refuse_backward(deployment(target), target, memory)
    assert refusal is not None and refusal.failed is not None
    assert refusal.failed.target == target
