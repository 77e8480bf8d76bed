"""The README's main job, end to end, on the session's local regions.

Real control planes with the chart installed by helm, the operator's pods and every
replica's real `hotload sidecar` and `hotload engine reference` processes run by the pod
runtime, a file:// bucket, a trainer taking real optimizer steps. It would catch any break
between the parts: a PolicySnapshot that never turns Ready, a region left behind, a corrupt
delta that is served or not reported (no ChainValid=False, no Degraded, no Event), replicas
that drop their last good snapshot, a Full that does not clear the break, a front that does
not name the policy that answered, and a ledger that does not list every replica.
"""

from __future__ import annotations

import pytest

from hotload.api import SnapshotKind
from hotload.local.demo import DemoSettings, run_demo
from hotload.local.lifecycle import LocalRegions
from tests.fixtures.cluster import SESSION_CHART

pytestmark = pytest.mark.cluster


def test_demo_rolls_out_survives_a_corrupt_delta_and_recovers_with_the_next_full(
    operated_regions: LocalRegions, operated_namespace: str
) -> None:
    lines: list[str] = []
    names = set(operated_regions.names)
    settings = DemoSettings(
        regions=len(operated_regions.regions),
        replicas=1,
        deltas=1,
        namespace=operated_namespace,
        state_dir=operated_regions.state_dir,
        index_base=operated_regions.regions[0].index,
        ready_timeout_s=240,
        chart=SESSION_CHART,
    )

    result = run_demo(settings, say=lines.append)

    full, delta = (t.snapshot for t in result.timings)
    assert (full.kind, delta.kind) == (SnapshotKind.FULL, SnapshotKind.INCREMENTAL)
    assert delta.previous == full.identity
    assert delta.stored_bytes < full.stored_bytes
    for timing in result.timings:
        assert timing.reason_by_region.keys() == names
        assert set(timing.reason_by_region.values()) <= {"Rolled", "Superseded"}

    broken = result.broken
    assert broken is not None
    assert broken.snapshot.previous == delta.identity and broken.last_good == delta.identity
    assert broken.chain_reason_by_region == dict.fromkeys(names, "ChecksumMismatch")
    for region in names:
        assert broken.degraded_reason_by_region[region].startswith("ChecksumMismatch")
        assert broken.events_by_region[region], f"no Event in {region}"
        assert set(broken.served_by_region[region].values()) == {delta.identity}
    assert broken.answers == dict.fromkeys(names, (f"policy@{delta.identity}", delta.identity))

    recovery = broken.recovery
    assert recovery is not None and recovery.snapshot.kind is SnapshotKind.FULL
    assert recovery.reason_by_region == dict.fromkeys(names, "Rolled")
    for region in names:
        assert broken.degraded_after_recovery[region].startswith("False")
    fresh = recovery.snapshot.identity
    assert result.answers == dict.fromkeys(names, (f"policy@{fresh}", fresh))

    assert "demo-0" in result.ledger and fresh in result.ledger
    for region in names:
        assert region in result.ledger
