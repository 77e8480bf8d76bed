"""The README's main job, end to end, on three regions with their own buckets.

Real control planes with the chart installed by helm, the operator's pods and every
replica's real `hotload sidecar` and `hotload engine reference` processes run by the pod
runtime, a bucket per region behind a WAN link (replicated from the home region), a trainer
taking real optimizer steps and publishing through the publisher. It would catch any break
between the parts: a PolicySnapshot that never turns Ready, a region left behind, bytes
crossing the WAN more than once per region, a corrupt delta that is served or not reported
(no ChainValid=False, no Degraded, no Event), replicas that drop their last good snapshot, a
next step that is not the Full that clears the break, a front that does not name the policy
that answered, and a ledger that does not list every replica.
"""

from __future__ import annotations

import pytest

from hotload.api import SnapshotKind
from hotload.local.demo import DemoSettings, run_demo
from hotload.local.lifecycle import LocalRegions
from tests.fixtures.cluster import SESSION_CHART

pytestmark = pytest.mark.cluster

#: Requests, signatures and replication's own traffic on top of a snapshot's files.
WAN_OVERHEAD = 48 * 1024


def test_demo_publishes_to_three_regions_survives_a_corrupt_delta_and_recovers(
    wan_regions: LocalRegions, wan_namespace: str
) -> None:
    lines: list[str] = []
    names = set(wan_regions.names)
    settings = DemoSettings(
        regions=len(wan_regions.regions),
        replicas=1,
        steps=3,
        corrupt_step=2,
        namespace=wan_namespace,
        state_dir=wan_regions.state_dir,
        index_base=wan_regions.regions[0].index,
        size="tiny",
        ready_timeout_s=300,
        chart=SESSION_CHART,
    )

    result = run_demo(settings, say=lines.append)

    full, delta = (t.snapshot for t in result.timings[:2])
    assert (full.kind, delta.kind) == (SnapshotKind.FULL, SnapshotKind.INCREMENTAL)
    assert delta.previous == full.identity
    assert delta.stored_bytes < full.stored_bytes
    for timing in result.timings:
        assert timing.reason_by_region.keys() == names
        assert set(timing.reason_by_region.values()) <= {"Rolled", "Superseded"}
        # Once per region over the WAN: the upload into the home region, replication
        # into the others; never twice. (MinIO's replication resends the part of an object
        # it was sending when a request to a busy peer timed out, so on a loaded machine a
        # region may carry more than one copy's bytes, but never a second whole copy.)
        crossed = timing.wan_bytes
        stored = timing.snapshot.stored_bytes
        assert all(stored <= crossed[n] < 2 * stored + WAN_OVERHEAD for n in names), crossed
        assert timing.answers == dict.fromkeys(names, timing.snapshot.identity)

    broken = result.broken
    assert broken is not None
    assert broken.snapshot.previous == delta.identity and broken.last_good == delta.identity
    assert broken.corrupted_key.startswith(f"{broken.snapshot.identity}/")
    assert broken.chain_reason_by_region == dict.fromkeys(names, "ChecksumMismatch")
    for region in names:
        assert broken.degraded_reason_by_region[region].startswith("ChecksumMismatch")
        assert broken.events_by_region[region], f"no Event in {region}"
        assert set(broken.served_by_region[region].values()) == {delta.identity}
    assert broken.answers == dict.fromkeys(names, (f"policy@{delta.identity}", delta.identity))

    recovery = broken.recovery
    assert recovery is not None and recovery.snapshot.kind is SnapshotKind.FULL
    assert recovery.snapshot.why == "chain-broken"
    assert recovery.reason_by_region == dict.fromkeys(names, "Rolled")
    for region in names:
        assert broken.degraded_after_recovery[region].startswith("False")
    fresh = recovery.snapshot.identity
    assert result.answers == dict.fromkeys(names, (f"policy@{fresh}", fresh))

    assert "demo-0" in result.ledger and fresh in result.ledger
    for region in names:
        assert region in result.ledger
