"""Checkpoints beside the chain, against real apiservers and real buckets.

At the cadence's step the publisher publishes a delta and, on its own lane, a Full of the
same weights; once that Full is in every region's bucket, each later delta names it (in
its v5 manifest and its PolicySnapshot), and a replica that holds nothing rebuilds the
newest weights from the checkpoint and the deltas after it, bit for bit, without reading
anything older. Would catch: a checkpoint named before it is everywhere, a delta that
waits behind it, a checkpoint of other weights, one named after its chain restarted, one
lost when the publisher stops on the way, the chain before it still being read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api import LoadPath, SnapshotKind
from hotload.api.formats import FORMAT_V5
from hotload.publish import Publisher
from hotload.snapshot import MANIFEST_NAME, Manifest, parse_manifest, plan_update_with, rebuild

from .test_publisher_regions import (  # noqa: F401  (fixtures)
    DEPLOYMENT,
    Scene,
    buckets,
    deployment,
    scene,
    settings,
    snapshots,
    weights,
)

pytestmark = pytest.mark.cluster

CHECKPOINT = "run-step-2-checkpoint"


def every_two(at: Scene, **overrides: Any) -> Any:
    return settings(at, full_every=2, **overrides)


def read(bucket: Path, identity: str) -> Manifest:
    return parse_manifest(
        (bucket / identity / MANIFEST_NAME).read_bytes(), expected_identity=identity
    )


def publish_through_a_checkpoint(publisher: Publisher, at: Scene) -> list[Any]:
    """Steps 0-3: the Full, a delta, the delta whose Full goes beside the chain, and (once
    that Full is everywhere) a delta that names it."""
    results = [publisher.publish(at.weights[s], s).result(timeout=120) for s in (0, 1, 2)]
    assert publisher.wait_for_checkpoint(120)
    results.append(publisher.publish(at.weights[3], 3).result(timeout=120))
    return results


def test_the_cadence_goes_beside_the_chain_and_later_deltas_name_it(scene: Scene) -> None:  # noqa: F811
    with Publisher(every_two(scene)) as publisher:
        full, one, two, three = publish_through_a_checkpoint(publisher, scene)

    assert (full.kind, one.why) == (SnapshotKind.FULL, "delta")
    # The cadence's step is a delta like any other; its weights went out beside it.
    assert (two.kind, two.why, two.previous) == (
        SnapshotKind.INCREMENTAL,
        "checkpoint",
        one.identity,
    )
    assert two.checkpoint_begun == CHECKPOINT and two.checkpoint is None
    assert (three.kind, three.previous, three.checkpoint) == (
        SnapshotKind.INCREMENTAL,
        two.identity,
        CHECKPOINT,
    )
    [done] = three.checkpoint_done
    assert (done.identity, done.of, done.step, done.complete) == (CHECKPOINT, two.identity, 2, True)
    assert done.stored_bytes > two.stored_bytes

    for name, bucket in scene.buckets.items():
        checkpoint = read(bucket, CHECKPOINT)
        assert (checkpoint.kind, checkpoint.step) == (SnapshotKind.FULL, 2)
        named = read(bucket, three.identity)
        assert named.format == FORMAT_V5
        assert (named.checkpoint.identity, named.checkpoint.of) == (CHECKPOINT, two.identity)  # type: ignore[union-attr]
        assert read(bucket, two.identity).checkpoint is None  # named only once complete
        objects = snapshots(scene.clients[name], scene.namespace)
        assert CHECKPOINT not in objects  # beside the chain: no PolicySnapshot of its own
        incremental = objects[three.identity]["spec"]["incremental"]
        assert incremental["checkpoint"] == {"identity": CHECKPOINT, "of": two.identity}
        assert incremental["compressionFormat"] == FORMAT_V5
    state = json.loads((scene.workdir / "state.json").read_text())
    assert state["checkpoint"]["identity"] == CHECKPOINT and state["checkpoint_pending"] is None


def test_a_replica_with_nothing_rebuilds_from_the_checkpoint_bit_for_bit(
    scene: Scene,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    with Publisher(every_two(scene)) as publisher:
        *_, three = publish_through_a_checkpoint(publisher, scene)
    bucket = next(iter(scene.buckets.values()))
    loaded: list[str] = []

    def load(identity: str) -> Manifest:
        loaded.append(identity)
        return read(bucket, identity)

    plan = plan_update_with(None, three.identity, load)
    assert (plan.via, plan.apply) == (LoadPath.REPLAY, (CHECKPOINT, three.identity))
    # Nothing before the checkpoint's snapshot is read: it may be deleted.
    assert loaded == [three.identity, CHECKPOINT]
    base = tmp_path / "rebuilt-checkpoint"
    rebuild(None, bucket / CHECKPOINT, base)
    out = tmp_path / "rebuilt"
    rebuild(base, bucket / three.identity, out, verify_previous=True)
    trained = (scene.weights[3] / "model.safetensors").read_bytes()
    assert (out / "model.safetensors").read_bytes() == trained


def test_a_checkpoint_that_fails_is_kept_and_finished_by_the_next_publisher(
    scene: Scene,  # noqa: F811  (the fixture imported above)
) -> None:
    """One region's bucket cannot be learnt while the checkpoint goes out (its
    RolloutDeployment is gone): the attempt fails, the deltas go on, and the checkpoint
    stays pending, its weights pinned, through the publisher's close; the next publisher
    on the work directory finishes it once the region is back, and the deltas name it."""
    gone = scene.regions.names[-1]
    custom = k8s.CustomObjectsApi(scene.clients[gone])
    with Publisher(every_two(scene)) as publisher:
        for step in (0, 1):
            publisher.publish(scene.weights[step], step).result(timeout=120)
        custom.delete_namespaced_custom_object(
            "hotload.dev", "v1alpha1", scene.namespace, "rolloutdeployments", DEPLOYMENT
        )
        two = publisher.publish(scene.weights[2], 2).result(timeout=120)
        assert two.checkpoint_begun == CHECKPOINT
        assert publisher.wait_for_checkpoint(120)
    state = json.loads((scene.workdir / "state.json").read_text())
    assert state["checkpoint"] is None
    assert state["checkpoint_pending"]["identity"] == CHECKPOINT
    assert Path(state["checkpoint_pending"]["weights"]).is_dir()  # pinned until complete
    assert not (scene.buckets[gone] / CHECKPOINT / MANIFEST_NAME).exists()

    custom.create_namespaced_custom_object(
        "hotload.dev", "v1alpha1", scene.namespace, "rolloutdeployments",
        deployment(scene.buckets[gone]),
    )  # fmt: skip
    with Publisher(every_two(scene)) as publisher:
        three = publisher.publish(scene.weights[3], 3).result(timeout=120)
        assert publisher.wait_for_checkpoint(120)
        four = publisher.publish(scene.weights[4], 4).result(timeout=120)
    assert three.checkpoint is None  # not known complete when step 3 went out
    assert [(d.identity, d.complete) for d in four.checkpoint_done] == [(CHECKPOINT, True)]
    assert four.checkpoint == CHECKPOINT
    for bucket in scene.buckets.values():
        assert read(bucket, CHECKPOINT).kind is SnapshotKind.FULL
        assert read(bucket, four.identity).checkpoint is not None
    state = json.loads((scene.workdir / "state.json").read_text())
    assert state["checkpoint"]["identity"] == CHECKPOINT
    # The cadence went on from the step the checkpoint began: step 4 begins the next one.
    assert four.checkpoint_begun == "run-step-4-checkpoint"


def test_a_chain_restarted_by_a_full_drops_its_checkpoint(scene: Scene) -> None:  # noqa: F811
    with Publisher(every_two(scene)) as publisher:
        publish_through_a_checkpoint(publisher, scene)
        restart = publisher.publish(scene.weights[4], 4, full=True).result(timeout=120)
        after = publisher.publish(scene.weights[5], 5).result(timeout=120)
    assert (restart.kind, restart.why) == (SnapshotKind.FULL, "requested")
    assert (after.previous, after.checkpoint) == (restart.identity, None)
    for bucket in scene.buckets.values():
        manifest = read(bucket, after.identity)
        assert manifest.checkpoint is None and manifest.format != FORMAT_V5


def test_without_checkpoints_the_cadence_is_a_full_in_the_chain(scene: Scene) -> None:  # noqa: F811
    with Publisher(every_two(scene, checkpoints=False)) as publisher:
        results = [publisher.publish(scene.weights[s], s).result(timeout=120) for s in (0, 1, 2)]
        assert publisher.wait_for_checkpoint(1)
    assert (results[2].kind, results[2].why) == (SnapshotKind.FULL, "cadence")
    assert results[2].checkpoint_begun is None
    for bucket in scene.buckets.values():
        assert not (bucket / CHECKPOINT).exists()
