"""Which report may wait (one write per quick load) and which must go at once.

A table of (what the Pod says, what the agent wants it to say): only "the replica now
works on a newer target, nothing else changed" may be held back; anything the operator,
a user or the Service reads as a fact about what is served goes at once. Would catch: a
dropped snapshot, a failure, a retry's reason or a gate change waiting behind the hold
(the pod claiming what the engine no longer serves), a quick delta writing Loading, or a
fleet's held writes all falling due in the same second.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from hotload.api import LoadPath, ReplicaState, reasons
from hotload.sidecar.pod_report import PodAnnotations, ReadinessGate, readiness_gate
from hotload.sidecar.pod_writer import HOLD_SPREAD, ObservedPod, hold_for, working_on_only

MOMENT = datetime(2026, 11, 23, 9, 45, tzinfo=UTC)
LATER = datetime(2026, 11, 23, 9, 46, tzinfo=UTC)
VERIFIED = readiness_gate(4, "s-4", 4, None)


def pod(annotations: PodAnnotations | None, gate: ReadinessGate = VERIFIED) -> ObservedPod:
    values = annotations.values() if annotations else {}
    return ObservedPod(
        {k: v for k, v in values.items() if v is not None},
        gate.ready,
        gate.reason,
        gate.message,
        MOMENT,
        "uid-1",
    )


READY_4 = PodAnnotations("s-4", "s-4", ReplicaState.READY, MOMENT, LoadPath.DELTA)
LOADING_5 = PodAnnotations("s-4", "s-5", ReplicaState.LOADING, LATER, LoadPath.DELTA)
LOADING_6 = PodAnnotations("s-4", "s-6", ReplicaState.LOADING, LATER, LoadPath.DELTA)
FRESH = PodAnnotations(None, "s-4", ReplicaState.LOADING, LATER)


@pytest.mark.parametrize(
    ("name", "observed", "wanted", "gate", "may_wait"),
    [
        ("a new target while serving the old one", pod(READY_4), LOADING_5, VERIFIED, True),
        ("a newer target while still loading", pod(LOADING_5), LOADING_6, VERIFIED, True),
        ("a new pod's first load", pod(None, readiness_gate(None, None, 4, None)), FRESH,
         readiness_gate(None, None, 4, None), True),
        ("the load ended: Ready", pod(READY_4),
         PodAnnotations("s-5", "s-5", ReplicaState.READY, LATER, LoadPath.DELTA), VERIFIED,
         False),
        ("a failure", pod(READY_4),
         PodAnnotations("s-4", "s-5", ReplicaState.FAILED, LATER, LoadPath.DELTA,
                        reasons.CHECKSUM_MISMATCH, "bad", "s-5"), VERIFIED, False),
        ("a transient retry names its reason", pod(READY_4),
         PodAnnotations("s-4", "s-5", ReplicaState.LOADING, LATER, LoadPath.DELTA,
                        reasons.STORAGE_UNAVAILABLE, "bucket down"), VERIFIED, False),
        ("the engine lost its weights: the snapshot goes", pod(READY_4),
         PodAnnotations(None, "s-4", ReplicaState.LOADING, LATER), VERIFIED, False),
        ("a reload changes how it was reached", pod(READY_4),
         PodAnnotations("s-4", "s-5", ReplicaState.LOADING, LATER, LoadPath.RELOAD), VERIFIED,
         False),
        ("the gate turns Stale", pod(READY_4), LOADING_6, readiness_gate(4, "s-4", 6, 1),
         False),
        ("the pod said Failed: Loading again goes at once",
         pod(PodAnnotations("s-4", "s-5", ReplicaState.FAILED, MOMENT, LoadPath.DELTA,
                            reasons.CHECKSUM_MISMATCH, "bad", "s-5")), LOADING_6, VERIFIED,
         False),
        ("another writer changed our snapshot", pod(
            PodAnnotations("s-9", "s-4", ReplicaState.READY, MOMENT, LoadPath.DELTA)),
         LOADING_5, VERIFIED, False),
    ],
)  # fmt: skip
def test_only_working_on_a_newer_target_may_wait(
    name: str, observed: ObservedPod, wanted: PodAnnotations, gate: ReadinessGate, may_wait: bool
) -> None:
    assert working_on_only(wanted, gate, observed) is may_wait, name


def test_holds_that_start_together_end_spread_out() -> None:
    """A fleet's replicas start holding in the same second; their Loading writes must not
    all fall due in the next one (1,000 of them did, and most failed under the burst)."""
    rng = random.Random(27)
    holds = [hold_for(10.0, rng) for _ in range(1000)]
    assert min(holds) >= 10.0
    assert max(holds) <= 10.0 * (1 + HOLD_SPREAD)
    busiest_second = max(sum(1 for h in holds if s <= h < s + 1) for s in range(10, 15))
    assert busiest_second <= 300, busiest_second  # uniform over 5 s: ~200 a second
