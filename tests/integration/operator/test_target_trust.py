"""The target is the operator's: what another writer does to it, or to the snapshots it
names, never moves the fleet backward unsaid and unguarded (issue 22, findings 1, 3, 4).

Real control plane, the chart's operator, real sidecars (noop engine) fetching from a
``file://`` bucket; every replica's report is watched for the whole test.
"""

from __future__ import annotations

import json
import time
from typing import Any

from hotload.api.reasons import CHAIN_BREAKING_REASONS
from tests.integration.operator.conftest import Rollout
from tests.integration.operator.tiny_chain import TinySnapshot

#: Longer than a sidecar takes to correct a report it did not write (5 s) plus the time a
#: report must stand before the operator believes it without a digest (6 s).
FORGED_WATCH_S = 12.0


def _rolled_out(rollout: Rollout) -> tuple[TinySnapshot, TinySnapshot]:
    """Two replicas that served a Full and then serve a delta on it, both Ready."""
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    s1 = rollout.publish(1)
    rollout.wait_ready(s0.identity, s1.identity)
    return s0, s1


def test_a_served_snapshot_deleted_by_hand_is_held_and_the_fleet_stays_on_it(
    rollout: Rollout,
) -> None:
    """Would catch (finding 4): ``kubectl delete psnap`` of the snapshot every replica
    serves rolling the fleet back a step with no guard, a held deletion never said, a
    deletion held for ever once a newer snapshot rolled out."""
    s0, s1 = _rolled_out(rollout)
    history = rollout.history()
    try:
        rollout.run("delete", "policysnapshot", s1.identity, "--wait=false")
        held = rollout.wait_for(
            "the held deletion said",
            lambda: [e for e in rollout.events(rollout.name) if e["reason"] == "DeletionHeld"],
            timeout_s=60,
        )
        assert s1.identity in held[0]["message"], held
        body = rollout.snapshot(s1.identity)
        assert body["metadata"].get("deletionTimestamp"), "not even marked for deletion"
        assert "hotload.dev/served" in body["metadata"]["finalizers"]
        assert rollout.target() == s1.identity

        # The next snapshot rolls out; then nobody needs s1 and its deletion completes.
        s2 = rollout.publish(2, full=True)
        rollout.wait_ready(s2.identity)
        rollout.wait_for(
            f"{s1.identity} gone",
            lambda: rollout.kubectl.run(
                "-n", rollout.namespace, "get", "policysnapshot", s1.identity,
                context=rollout.region,
            ).returncode == 1,
            timeout_s=60,
        )  # fmt: skip
    finally:
        history.stop()
    # No replica ever went back to s0, and the operator never moved the target back.
    after_delete = history.served()
    assert s0.identity not in after_delete, after_delete
    assert not [e for e in rollout.events(rollout.name) if e["reason"] == "TargetRolledBack"]


def _patch_target(rollout: Rollout, **fields: Any) -> None:
    """Another writer (a user with kubectl) edits the deployment's target."""
    patch = json.dumps({"status": {"targetSnapshot": fields}})
    rollout.run("patch", "rolloutdeployment", rollout.name, "--subresource=status",
                "--type=merge", "-p", patch)  # fmt: skip


def _repairs(rollout: Rollout) -> int:
    return sum(1 for e in rollout.events(rollout.name) if e["reason"] == "TargetRepaired")


def test_a_hand_edit_of_one_field_of_the_target_never_marks_a_good_snapshot(
    rollout: Rollout,
) -> None:
    """Would catch (finding 1): a step or kind edited by hand read as a bad snapshot — every
    sidecar failing the target with a chain-breaking reason, the snapshot every replica
    served marked ChainValid=False for good, the fleet rolled back and every later delta
    ChainBroken — and a repair that is not said."""
    s0, s1 = _rolled_out(rollout)
    for edit in ({"step": 7}, {"kind": "Full"}):
        before = _repairs(rollout)
        _patch_target(rollout, **edit)
        rollout.wait_for(f"the edit {edit} repaired and said", lambda b=before: (
            _repairs(rollout) > b
            and (rollout.deployment()["status"]["targetSnapshot"]
                 == {"identity": s1.identity, "step": 1, "kind": "Incremental",
                     "kvCachePolicy": "all"})
        ), timeout_s=30)  # fmt: skip
    # The chain stays good: the next delta rolls out on it, nobody failed for the chain.
    s2 = rollout.publish(2)
    rollout.wait_ready(s2.identity)
    for snapshot in (s0, s1, s2):
        assert rollout.condition(rollout.snapshot(snapshot.identity), "ChainValid")[0] == "True"
    breaking = [e for e in rollout.events(rollout.name) if e["reason"] in CHAIN_BREAKING_REASONS]
    assert breaking == [], breaking


def test_a_target_moved_back_by_hand_is_repaired_before_any_engine_loads_it(
    rollout: Rollout,
) -> None:
    """Would catch (finding 4): a target moved back by another writer loaded by every
    engine before the operator restores it (the sidecars follow a backward target only
    when the operator's status.rollback names it)."""
    s0, s1 = _rolled_out(rollout)
    history = rollout.history()
    try:
        _patch_target(rollout, identity=s0.identity, step=0, kind="Full")
        rollout.wait_for("the move back repaired and said", lambda: (
            _repairs(rollout) > 0 and rollout.target() == s1.identity
        ), timeout_s=30)  # fmt: skip
        s2 = rollout.publish(2)
        rollout.wait_ready(s2.identity)
    finally:
        history.stop()
    assert s0.identity not in history.served(), history.seen


def test_pods_annotated_by_hand_as_serving_a_snapshot_never_make_it_ready(
    rollout: Rollout,
) -> None:
    """Would catch (finding 3): Ready latched on the pods' word alone — every pod
    annotated by hand as serving the next snapshot while its engine cannot load it — and
    still latched after the sidecars corrected their pods."""
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    s1 = rollout.prepare(1)
    held = rollout.chain.bucket_dir / s1.identity
    aside = held.with_name(f".held-{s1.identity}")
    held.rename(aside)  # the engines cannot load it: its files are not in the bucket
    try:
        rollout.apply(s1.policy_snapshot(rollout.name))
        rollout.wait_for("the target moved", lambda: rollout.target() == s1.identity)
        for pod in rollout.pods():
            rollout.run("annotate", "pod", pod.metadata.name, "--overwrite",
                        f"hotload.dev/snapshot={s1.identity}",
                        f"hotload.dev/target={s1.identity}", "hotload.dev/state=Ready")  # fmt: skip
        # Longer than the sidecars take to correct their pods and the operator to believe
        # a report that stood: Ready never latches, and the sidecars put the truth back.
        deadline = time.monotonic() + FORGED_WATCH_S
        while time.monotonic() < deadline:
            ready = rollout.condition(rollout.snapshot(s1.identity), "Ready")
            assert ready[0] != "True", f"latched on forged reports: {ready}"
            time.sleep(0.5)
        assert set(rollout.serving().values()) == {s0.identity}, rollout.serving()
    finally:
        aside.rename(held)
    rollout.wait_ready(s1.identity)  # the real load, once its files are there
    ledger = rollout.ledger(s1.identity)
    assert {e["corroboration"] for e in ledger.values()} == {"Digest"}, ledger
