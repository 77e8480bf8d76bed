"""A publisher behind its regions publishes the newest step and never holds the trainer.

Real control planes and file:// buckets; the publisher waits for each snapshot's Ready,
which no operator gives here (``t-*`` namespaces are watched by none), so every publish
takes ``wait_timeout_s``: the links are slower than the trainer. Would catch: a publish
call blocked behind the running one (the trainer held for the link), stale steps still
published one after the other, a skipped step's handle left hanging, the newest step
encoded against a snapshot that was never published (a chain no region can follow).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hotload.api import SnapshotKind
from hotload.publish import Publisher, RegionOutcome
from hotload.snapshot.decoder import rebuild
from hotload.waiting import wait_until

from .test_publisher_regions import (  # noqa: F401  (fixtures)
    Scene,
    buckets,
    scene,
    settings,
    snapshot_names,
    weights,
)

pytestmark = pytest.mark.cluster

WAIT_S = 5.0


def test_the_newest_step_replaces_the_stale_ones_and_the_trainer_only_copies(
    scene: Scene,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    registry = CollectorRegistry()
    with Publisher(
        settings(scene, wait=True, wait_timeout_s=WAIT_S), registry=registry
    ) as publisher:
        first = publisher.publish(scene.weights[0], 0)
        region = scene.regions.names[0]
        applied = wait_until(
            lambda: "run-step-0-full" in snapshot_names(scene.clients[region], scene.namespace),
            timeout_s=60,
        )
        assert applied  # step 0 runs: it is now waiting for its Ready
        handles = [publisher.publish(scene.weights[step], step) for step in (1, 2, 3)]
        # Every call returned after its copy, while step 0 still waited for its regions.
        assert all(handle.blocked_seconds < 1.0 for handle in [first, *handles])
        began = time.monotonic()
        full = first.result(timeout=120)
        newest = [handle.result(timeout=120) for handle in handles]
        took = time.monotonic() - began

    assert (full.identity, full.kind, full.skipped_steps) == (
        "run-step-0-full",
        SnapshotKind.FULL,
        [],
    )
    # Steps 1 and 2 were never published: their handles give step 3's result.
    assert [r.identity for r in newest] == ["run-step-3"] * 3
    step3 = newest[2]
    assert (step3.kind, step3.previous, step3.why) == (
        SnapshotKind.INCREMENTAL,
        "run-step-0-full",
        "delta",
    )
    assert step3.skipped_steps == [1, 2]
    assert {r.outcome for r in step3.regions.values()} == {RegionOutcome.TIMED_OUT}
    # Two waits, not four: the stale steps cost the links nothing.
    assert took < 3 * WAIT_S + 30
    for name in scene.regions.names:
        assert snapshot_names(scene.clients[name], scene.namespace) == [
            "run-step-0-full",
            "run-step-3",
        ]
    assert registry.get_sample_value("hotload_publisher_skipped_steps_total") == 2
    assert registry.get_sample_value("hotload_publisher_published_step") == 3
    assert registry.get_sample_value("hotload_publisher_offered_step") == 3
    assert (
        registry.get_sample_value("hotload_publisher_snapshots_total", {"kind": "Incremental"}) == 1
    )
    assert registry.get_sample_value("hotload_publisher_blocked_seconds_count") == 4

    # The direct delta rebuilds step 3's weights exactly from what every region holds.
    bucket = next(iter(scene.buckets.values()))
    base = tmp_path / "rebuilt-0"
    rebuild(None, bucket / "run-step-0-full", base)
    out = tmp_path / "rebuilt-3"
    rebuild(base, bucket / "run-step-3", out)
    # (the rebuild is byte-exact, header included)
    want = (scene.weights[3] / "model.safetensors").read_bytes()
    assert (out / "model.safetensors").read_bytes() == want
    assert (base / "model.safetensors").read_bytes() != want
