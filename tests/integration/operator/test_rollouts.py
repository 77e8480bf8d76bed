"""Rollouts through the chart-installed operator, as a trainer and a user see them.

Real control plane, the operator run by the pod runtime from the chart's Deployment, real
sidecars (noop engine) that fetch, verify and rebuild every snapshot from a ``file://``
bucket. Each test names what it would catch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from hotload.api import reasons
from tests.integration.operator.conftest import Rollout


def test_full_then_deltas_roll_out_and_a_skipped_step_turns_ready_as_superseded(
    rollout: Rollout,
) -> None:
    """Would catch: a target that never moves, a Ready that never latches (kubectl wait
    hangs), a skipped step that never turns Ready, a ledger that is not exact."""
    rollout.create(replicas=3)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    table = rollout.run("get", "psnap", s0.identity)
    assert "3/3" in table and "Ready" in table, table
    uids = {pod.metadata.uid for pod in rollout.pods()}

    # A fast trainer: two steps in the bucket before either is applied.
    s1, s2 = rollout.prepare(1), rollout.prepare(2)
    # Applied out of order (s2 before its previous): Unknown, never a break, never the target.
    rollout.apply(s2.policy_snapshot(rollout.name))
    rollout.wait_for(
        f"{s2.identity} PreviousMissing",
        lambda: (
            rollout.condition(rollout.snapshot(s2.identity), "ChainValid")
            == ("Unknown", "PreviousMissing")
        ),
    )
    assert rollout.target() == s0.identity
    rollout.apply(s1.policy_snapshot(rollout.name))
    rollout.wait_ready(s1.identity, s2.identity)
    assert rollout.condition(rollout.snapshot(s1.identity), "Ready") == ("True", "Superseded")
    assert rollout.condition(rollout.snapshot(s2.identity), "Ready") == ("True", "Rolled")

    assert {pod.metadata.uid for pod in rollout.pods()} == uids  # hot-loaded: no pod restarted
    ledger = rollout.ledger(s2.identity)
    assert sorted(ledger) == ["fleet-0", "fleet-1", "fleet-2"]
    assert {(e["state"], e["snapshot"]) for e in ledger.values()} == {("Ready", s2.identity)}
    status = rollout.deployment()["status"]
    assert status["targetSnapshot"]["identity"] == s2.identity
    assert status["currentSnapshot"]["identity"] == s2.identity
    assert status["replicasByState"] == {"Ready": 3}
    assert rollout.condition(rollout.deployment(), "SnapshotReady") == ("True", "Rolled")
    propagation = rollout.snapshot(s2.identity)["status"]["propagation"]
    assert propagation["targetSetAt"] <= propagation["allReplicasReadyAt"]

    # `hotload ledger` reads the same truth from the pods.
    hotload = shutil.which("hotload", path=str(Path(sys.executable).parent)) or "hotload"
    out = subprocess.run(
        [hotload, "ledger", rollout.name, "-n", rollout.namespace, "-o", "json",
         "--kubeconfig", str(rollout.kubectl.kubeconfig), "--context", rollout.region],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = json.loads(out.stdout)
    assert [(r["pod"], r["snapshot"], r["state"], r["behind"]) for r in rows] == [
        (f"fleet-{i}", s2.identity, "Ready", 0) for i in range(3)
    ]


def test_corrupt_delta_marks_the_chain_holds_the_target_and_the_next_full_clears_it(
    rollout: Rollout,
) -> None:
    """Would catch: a corrupt delta served or reported, a break not marked (ChainValid,
    Degraded, Event), the target moving onto or past the break, a Full not resetting it."""
    rollout.create(replicas=2)
    history = rollout.history()
    try:
        s0 = rollout.publish(0, full=True)
        rollout.wait_ready(s0.identity)
        bad = rollout.publish(1, corrupt=True)
        rollout.wait_for(
            f"{bad.identity} ChainValid=False",
            lambda: rollout.condition(rollout.snapshot(bad.identity), "ChainValid")[0] == "False",
        )
        assert rollout.condition(rollout.snapshot(bad.identity), "ChainValid")[1] in (
            reasons.CHAIN_BREAKING_REASONS
        )
        assert rollout.snapshot(bad.identity)["status"]["phase"] == "Failed"
        rollout.wait_for("the target back on the last good snapshot",
                         lambda: rollout.target() == s0.identity)  # fmt: skip
        degraded = rollout.condition(rollout.deployment(), "Degraded")
        assert degraded[0] == "True" and degraded[1] in reasons.CHAIN_BREAKING_REASONS
        warnings = [e for e in rollout.events(bad.identity) if e["type"] == "Warning"]
        assert warnings and warnings[0]["reason"] in reasons.CHAIN_BREAKING_REASONS

        after = rollout.publish(2)  # a delta built on the broken one: never the target
        rollout.wait_for(
            f"{after.identity} broken too",
            lambda: (
                rollout.condition(rollout.snapshot(after.identity), "ChainValid")
                == ("False", reasons.CHAIN_BROKEN)
            ),
        )
        assert rollout.target() == s0.identity
        assert rollout.all_serve(s0.identity, 2)

        fresh = rollout.publish(3, full=True)
        rollout.wait_ready(fresh.identity)
        assert rollout.condition(rollout.deployment(), "Degraded")[0] == "False"
        assert rollout.all_serve(fresh.identity, 2)
    finally:
        history.stop()
    assert not {bad.identity, after.identity} & history.served(), history.seen


def test_a_pod_deleted_mid_chain_catches_up_and_scaling_keeps_the_ledger_exact(
    rollout: Rollout,
) -> None:
    """Would catch: a new pod left behind, ledger entries of pods that are gone, missing
    entries of new pods, counts that do not follow spec.replicas."""
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    rollout.publish(1)
    s2 = rollout.publish(2)
    rollout.run("delete", "pod", "fleet-1", "--wait=false")
    rollout.wait_ready(s2.identity)
    rollout.wait_for("both replicas on the newest", lambda: rollout.all_serve(s2.identity, 2))

    for replicas in (5, 1):
        rollout.run("scale", "rolloutdeployment", rollout.name, f"--replicas={replicas}")
        expected = [f"fleet-{i}" for i in range(replicas)]
        rollout.wait_for(
            f"a ledger of exactly {replicas} Ready replicas",
            lambda expected=expected: (
                sorted(rollout.ledger(s2.identity)) == expected
                and all(e["state"] == "Ready" for e in rollout.ledger(s2.identity).values())
            ),
        )
        summary = rollout.snapshot(s2.identity)["status"]["replicasSummary"]
        assert summary == f"{replicas}/{replicas}"
        rollout.wait_for(
            "deployment counts", lambda r=replicas: rollout.deployment()["status"]["replicas"] == r
        )


def test_retention_keeps_exactly_what_a_replica_may_still_need(rollout: Rollout) -> None:
    """Would catch: deleting a link a replica replays through, keeping snapshots forever."""
    rollout.create(replicas=1, keep=2)
    chain = [rollout.publish(0, full=True), rollout.publish(1), rollout.publish(2)]
    rollout.wait_ready(chain[-1].identity)
    names = {s.identity for s in chain}
    listed = set(rollout.run("get", "psnap", "-o", "name").split())
    assert {f"policysnapshot.hotload.dev/{n}" for n in names} <= listed  # the chain to its Full
    newer = [rollout.publish(3, full=True), rollout.publish(4)]
    rollout.wait_ready(newer[-1].identity)
    rollout.wait_for(
        "the old chain deleted, the new one kept",
        lambda: (
            set(rollout.run("get", "psnap", "-o", "name").split())
            == {f"policysnapshot.hotload.dev/{s.identity}" for s in newer}
        ),
    )
    retired = [e for e in rollout.events(rollout.name) if e["reason"] == "SnapshotRetired"]
    assert len(retired) == 3


def test_retention_keeps_nothing_older_than_the_checkpoint_the_chain_names(
    rollout: Rollout,
) -> None:
    """Would catch: the API server pruning ``incremental.checkpoint`` (a CRD without it),
    retention still keeping the chain back to its Full once a checkpoint is named (with
    checkpoints beside the chain no new Full comes, so objects would pile up for ever), and
    deleting the checkpoint's ``of`` (a replica at it goes on by deltas from there)."""
    rollout.create(replicas=1, keep=1)
    before = [rollout.publish(0, full=True), rollout.publish(1), rollout.publish(2)]
    rollout.wait_ready(before[-1].identity)
    checkpoint, of = rollout.checkpoint()  # a Full of step 2's weights, in the bucket only
    assert of == before[-1].identity
    after = [rollout.publish(3), rollout.publish(4)]
    named = rollout.snapshot(after[-1].identity)["spec"]["incremental"]["checkpoint"]
    assert named == {"identity": checkpoint, "of": of}
    rollout.wait_ready(after[-1].identity)
    rollout.wait_for(
        "the links older than the checkpoint's snapshot deleted, the rest kept",
        lambda: (
            set(rollout.run("get", "psnap", "-o", "name").split())
            == {f"policysnapshot.hotload.dev/{s.identity}" for s in (before[-1], *after)}
        ),
    )
    retired = [e for e in rollout.events(rollout.name) if e["reason"] == "SnapshotRetired"]
    assert len(retired) == 2


def test_another_writer_is_repaired(rollout: Rollout) -> None:
    """Would catch: an operator that only reacts to its own transitions (edge-triggered)."""
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    rollout.wait_ready(s0.identity)
    rollout.run("scale", "statefulset", rollout.name, "--replicas=4")
    rollout.wait_for(
        "the StatefulSet back at 2 replicas",
        lambda: rollout.get("statefulset", rollout.name)["spec"]["replicas"] == 2,
    )
    rollout.run("delete", "service", rollout.name)
    rollout.wait_for("the Service recreated", lambda: rollout.name in rollout.run("get", "svc"))
    rollout.run(
        "patch", "rolloutdeployment", rollout.name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"targetSnapshot": {
            "identity": "not-a-snapshot", "step": 99, "kind": "Full", "kvCachePolicy": "all"}}}),
    )  # fmt: skip
    rollout.wait_for("the target repaired", lambda: rollout.target() == s0.identity)
    # A spec change reaches the owned StatefulSet.
    limits = {"limits": {"nvidia.com/gpu": "1"}}
    rollout.run("patch", "rolloutdeployment", rollout.name, "--type=merge",
                "-p", json.dumps({"spec": {"engine": {"resources": limits}}}))  # fmt: skip
    rollout.wait_for(
        "the StatefulSet's engine container updated",
        lambda: rollout.get("statefulset", rollout.name)["spec"]["template"]["spec"][
            "containers"][0].get("resources") == limits,
    )  # fmt: skip


def test_a_snapshot_of_a_missing_deployment_says_so(rollout: Rollout) -> None:
    """Would catch: a PolicySnapshot with a typo in deploymentRef left with empty columns."""
    orphan = rollout.prepare(0, full=True)
    rollout.apply(orphan.policy_snapshot("no-such-deployment"))
    rollout.wait_for(
        "Ready=False DeploymentNotFound",
        lambda: (
            rollout.condition(rollout.snapshot(orphan.identity), "Ready")
            == ("False", "DeploymentNotFound")
        ),
    )
    assert rollout.snapshot(orphan.identity)["status"]["phase"] == "Pending"
