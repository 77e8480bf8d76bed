"""The target is the operator's: what another writer does to it, or to the snapshots it
names, never moves the fleet backward unsaid and unguarded (issue 22, findings 1, 3, 4).

Real control plane, the chart's operator, real sidecars (noop engine) fetching from a
``file://`` bucket; every replica's report is watched for the whole test.
"""

from __future__ import annotations

import time

from tests.integration.operator.conftest import Rollout

#: Longer than a sidecar takes to correct a report it did not write (5 s) plus the time a
#: report must stand before the operator believes it without a digest (6 s).
FORGED_WATCH_S = 12.0


def test_a_served_snapshot_deleted_by_hand_is_held_and_the_fleet_stays_on_it(
    rollout: Rollout,
) -> None:
    """Would catch (finding 4): ``kubectl delete psnap`` of the snapshot every replica
    serves rolling the fleet back a step with no guard, a held deletion never said, a
    deletion held for ever once a newer snapshot rolled out."""
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    s1 = rollout.publish(1)
    rollout.wait_ready(s0.identity, s1.identity)
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
    # The sidecars report no digest yet: believed once their reports stood.
    ledger = rollout.ledger(s1.identity)
    assert {e["corroboration"] for e in ledger.values()} == {"Stood"}, ledger
