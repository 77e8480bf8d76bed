"""A new pod replays the chain from the last Full; a broken delta never reaches serving."""

from __future__ import annotations

import pytest

from hotload.snapshot import ManifestCheckpoint
from hotload.storage import Storage
from tests.fixtures.trainer import PROBE_TOKENS, Trainer
from tests.integration.sidecar.harness import SidecarHarness, eventually, rollout_deployment

pytestmark = pytest.mark.cluster


async def test_new_pod_at_step_seven_replays_from_the_last_full_bit_exact(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    harness.create_deployment(rollout_deployment("late", bucket_url))
    await trainer.publish_full()
    for _ in range(7):
        trainer.train_step()
        last = await trainer.publish_delta()
    assert last.step == 7
    harness.set_target("late", last.ref())

    replica = await harness.replica("late-0", "late")
    annotations = await harness.wait_state(replica, last.identity, "Ready")
    assert annotations["hotload.dev/snapshot"] == last.identity
    assert annotations["hotload.dev/via"] == "replay"
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["identity"] == last.identity
    assert served["sha256"] == trainer.expected_logits(last).sha256
    status = await harness.status(replica)
    swap = status["history"][0]
    assert swap["via"] == "replay"
    # The whole chain was fetched: the Full and all seven deltas, manifests included.
    assert swap["storedBytes"] == sum(p.stored_bytes for p in trainer.published)
    assert swap["fetchedBytes"] == swap["storedBytes"]
    # The chain was rebuilt in one buffer, link after link in place: only the served
    # snapshot stays there, the other buffer is untouched.
    assert status["buffers"] == {"a": last.identity, "b": None, "served": "a", "handed": None}
    assert sorted(p.name for p in (replica.staging / "buffers" / "a").iterdir()) == [last.identity]


async def test_new_pod_replays_from_the_checkpoint_without_the_chain_before_it(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str, storage: Storage
) -> None:
    """A checkpoint (a Full of step 3's weights, beside the chain) named by the deltas
    after it: a new pod loads it and those deltas only, so the chain before it may go."""
    harness.create_deployment(rollout_deployment("ckpt", bucket_url))
    await trainer.publish_full()
    for _ in range(3):
        trainer.train_step()
        of = await trainer.publish_delta()
    checkpoint = await trainer.publish_checkpoint(of)
    named = ManifestCheckpoint(identity=checkpoint.identity, of=of.identity)
    after = []
    for _ in range(2):
        trainer.train_step()
        after.append(await trainer.publish_delta(checkpoint=named))
    # What gc leaves once the checkpoint is named: nothing of the chain up to its snapshot.
    for gone in trainer.published[:4]:
        for relpath in gone.files:
            await storage.delete(f"{gone.identity}/{relpath}")
    last = after[-1]
    harness.set_target("ckpt", last.ref())

    replica = await harness.replica("ckpt-0", "ckpt")
    annotations = await harness.wait_state(replica, last.identity, "Ready")
    assert annotations["hotload.dev/via"] == "replay"
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["identity"] == last.identity
    assert served["sha256"] == trainer.expected_logits(last).sha256
    swap = (await harness.status(replica))["history"][0]
    # The checkpoint and the two deltas after it, nothing else.
    assert swap["storedBytes"] == checkpoint.stored_bytes + sum(p.stored_bytes for p in after)


async def test_corrupt_delta_keeps_last_good_snapshot_until_a_full_recovers(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    harness.create_deployment(rollout_deployment("corrupt", bucket_url))
    replica = await harness.replica("corrupt-0", "corrupt")
    full = await trainer.publish_full()
    trainer.train_step()
    good = await trainer.publish_delta()
    harness.set_target("corrupt", full.ref())
    await harness.wait_state(replica, full.identity, "Ready")
    harness.set_target("corrupt", good.ref())
    await harness.wait_state(replica, good.identity, "Ready")

    trainer.train_step()
    bad = await trainer.publish_delta()
    await trainer.flip_byte(bad)
    harness.set_target("corrupt", bad.ref())
    annotations = await harness.wait_state(replica, bad.identity, "Failed")
    assert annotations["hotload.dev/reason"] == "ChecksumMismatch"
    assert annotations["hotload.dev/snapshot"] == good.identity
    assert "hash differs" in annotations["hotload.dev/message"]
    status = await harness.status(replica)
    assert status["state"] == "Failed"
    assert status["lastError"]["reason"] == "ChecksumMismatch"
    assert status["current"]["identity"] == good.identity
    response = await harness.complete(replica)
    assert response.json()["model"] == f"corrupt@{good.identity}"
    # Serving its last good snapshot, the pod stays in its Service.
    # (The condition is a patch of its own, after the annotations'.)
    await eventually(
        lambda: (g := harness.gate("corrupt-0")) is not None and g.status == "True",
        timeout=30,
        what="the gate to stay True",
    )
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["sha256"] == trainer.expected_logits(good).sha256

    recovery = await trainer.publish_full()
    assert recovery.step == bad.step
    harness.set_target("corrupt", recovery.ref())
    annotations = await harness.wait_state(replica, recovery.identity, "Ready")
    assert annotations["hotload.dev/via"] == "full"
    assert "hotload.dev/reason" not in annotations
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["identity"] == recovery.identity
    assert served["sha256"] == trainer.expected_logits(recovery).sha256


async def test_a_listed_file_not_there_yet_is_retried_until_it_arrives(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str, storage: Storage
) -> None:
    harness.create_deployment(rollout_deployment("late-file", bucket_url, max_stale_steps=1))
    replica = await harness.replica("late-file-0", "late-file")
    full = await trainer.publish_full()
    harness.set_target("late-file", full.ref())
    await harness.wait_state(replica, full.identity, "Ready")

    trainer.train_step()
    trainer.train_step()
    delta = await trainer.publish_delta()
    assert delta.step == 2
    # Replication delivered the manifest before a file it lists.
    missing = next(f for f in delta.files if f.endswith(".bin"))
    held = await storage.get(f"{delta.identity}/{missing}", max_bytes=1 << 30)
    await storage.delete(f"{delta.identity}/{missing}")
    harness.set_target("late-file", delta.ref())

    async def retrying() -> bool:
        status = await harness.status(replica)
        error = status.get("lastError") or {}
        return error.get("reason") == "NotFound" and error.get("transient") is True

    await eventually(retrying, timeout=30, what="a NotFound being retried")
    # The Pod's annotations follow the agent's report asynchronously (the writer patches
    # after the fact): wait for them, they must say Loading while the file is missing.
    annotations = await harness.wait_state(replica, delta.identity, "Loading", timeout=30)
    assert annotations["hotload.dev/snapshot"] == full.identity
    # Two steps behind with maxStaleSteps 1: the readiness gate chooses freshness.
    stale = await eventually(
        lambda: (g := harness.gate("late-file-0")) is not None and g.status == "False" and g,
        timeout=30,
        what="the gate to turn False (Stale)",
    )
    assert stale.reason == "Stale"

    await storage.put(f"{delta.identity}/{missing}", held)
    await harness.wait_state(replica, delta.identity, "Ready")
    fresh = await eventually(
        lambda: (g := harness.gate("late-file-0")) is not None and g.status == "True" and g,
        timeout=30,
        what="the gate to turn True again",
    )
    assert fresh.reason == "Verified"
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["sha256"] == trainer.expected_logits(delta).sha256
