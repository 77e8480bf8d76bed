"""Ready latches only on reports the operator can corroborate (issue 22, finding 3).

Would catch: a snapshot latched Ready on pods annotated by hand (no digest, or a digest
that is not the snapshot's), replicas that disagree on the weights counted as one fleet,
a digest-less engine never latching, a pending report never planned again.
"""

from __future__ import annotations

from datetime import timedelta

from hotload.api import ReplicaState
from hotload.api.policy_snapshot import Corroboration
from hotload.operator.corroboration import REPORT_STANDS_S, corroborate
from hotload.operator.plan import plan_deployment
from tests.unit.operator.builders import T0, at, delta, full, observation, observed_snapshot, pod

GOOD = "0" * 31 + "1"
FORGED = "f" * 32


def _rolling(**digests: str | None) -> list:  # type: ignore[type-arg]
    return [observed_snapshot(full("s0", 0)), observed_snapshot(delta("s1", 1, "s0", **digests))]


def _status(identity: str) -> dict[str, object]:
    kind = "Full" if identity == "s0" else "Incremental"
    ref = {"identity": identity, "step": int(identity[1:]), "kind": kind, "kvCachePolicy": "all"}
    return {"targetSnapshot": ref}


def test_reports_written_by_hand_do_not_latch_ready_and_say_why() -> None:
    # Every pod "serves" s1 since a moment ago, without a digest (what a hand edit writes).
    forged = [pod(i, "s1", first_seen=at(0)) for i in range(2)]
    observed = observation(_rolling(), forged, replicas=2, status=_status("s1"))
    plan = plan_deployment(observed, at(1))
    patch = plan.snapshot_patches["s1"]
    assert patch["readyReplicas"] == 0
    assert not any(c["type"] == "Ready" and c["status"] == "True" for c in patch["conditions"])
    entry = patch["replicas"]["demo-0"]
    assert (entry["state"], entry["corroboration"]) == ("Loading", "Pending")
    assert "without a digest" in entry["message"]
    assert plan.recheck_at == at(REPORT_STANDS_S)  # planned again when it would stand


def test_a_report_without_a_digest_counts_once_it_stood_unchallenged() -> None:
    stood = [pod(i, "s1", first_seen=at(0)) for i in range(2)]
    observed = observation(_rolling(), stood, replicas=2, status=_status("s1"))
    plan = plan_deployment(observed, at(REPORT_STANDS_S + 0.1))
    patch = plan.snapshot_patches["s1"]
    assert patch["readyReplicas"] == 2
    assert {e["corroboration"] for e in patch["replicas"].values()} == {"Stood"}


def test_the_declared_digest_is_believed_at_once_and_any_other_is_disputed() -> None:
    good, forged = pod(0, "s1", digest=GOOD, first_seen=at(0)), pod(1, "s1", digest=FORGED,
                                                                     first_seen=at(0))  # fmt: skip
    observed = observation(_rolling(digest=GOOD), [good, forged], replicas=2,
                           status=_status("s1"))  # fmt: skip
    plan = plan_deployment(observed, at(0.5))
    ledger = plan.snapshot_patches["s1"]["replicas"]
    assert (ledger["demo-0"]["state"], ledger["demo-0"]["corroboration"]) == ("Ready", "Digest")
    assert ledger["demo-0"]["digest"] == GOOD
    assert (ledger["demo-1"]["state"], ledger["demo-1"]["reason"]) == ("Loading", "DigestMismatch")
    # However long it stands, a disputed report never counts.
    assert corroborate([forged], {"s1": GOOD}, at(600)).of(forged) is Corroboration.DISPUTED


def test_replicas_that_disagree_on_the_weights_are_all_disputed() -> None:
    long_ago = T0 - timedelta(hours=1)
    pods = [pod(0, "s1", digest=GOOD, first_seen=long_ago),
            pod(1, "s1", digest=FORGED, first_seen=long_ago)]  # fmt: skip
    believed = corroborate(pods, {}, at(0))
    assert set(believed.by_pod.values()) == {Corroboration.DISPUTED}
    agreeing = [pod(i, "s1", digest=GOOD, first_seen=long_ago) for i in range(2)]
    assert set(corroborate(agreeing, {}, at(0)).by_pod.values()) == {Corroboration.STOOD}


def test_a_failed_replica_is_not_a_report_of_serving() -> None:
    failed = pod(0, None, target="s1", state=ReplicaState.FAILED, reason="EngineRejected")
    assert corroborate([failed], {}, at(0)).by_pod == {}
