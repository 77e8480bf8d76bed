"""The README's main job, end to end, on the session's local regions.

Real control planes, the pod runtime running every replica's real `hotload sidecar` and
`hotload engine reference` processes, a file:// bucket, a trainer taking real optimizer
steps. It would catch any break between the parts: a snapshot that never reaches a
replica, a region left behind, a front that does not name the policy that answered.
"""

from __future__ import annotations

import pytest

from hotload.api import SnapshotKind
from hotload.local.demo import DemoSettings, run_demo
from hotload.local.lifecycle import LocalRegions

pytestmark = pytest.mark.cluster


def test_demo_rolls_a_full_and_a_delta_out_to_every_replica_in_every_region(
    local_regions: LocalRegions, namespace: str
) -> None:
    lines: list[str] = []
    settings = DemoSettings(
        regions=len(local_regions.regions),
        replicas=1,
        deltas=1,
        namespace=namespace,
        state_dir=local_regions.state_dir,
        index_base=local_regions.regions[0].index,
        ready_timeout_s=240,
    )

    result = run_demo(settings, say=lines.append)

    full, delta = (t.snapshot for t in result.timings)
    assert (full.kind, delta.kind) == (SnapshotKind.FULL, SnapshotKind.INCREMENTAL)
    assert delta.previous == full.identity
    assert delta.stored_bytes < full.stored_bytes
    for timing in result.timings:
        assert set(timing.seconds_by_region) == set(local_regions.names)
    assert result.answers == {
        name: (f"policy@{delta.identity}", delta.identity) for name in local_regions.names
    }
