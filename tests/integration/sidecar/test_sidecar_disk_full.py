"""A replica whose staging volume fills (issue 22, finding 8), on a real pod.

The pod's staging ``emptyDir`` has a ``sizeLimit``: the pod runtime makes it a tmpfs of
that size, as the kubelet does, and the test takes its room away with a filler file (the
engine or anything else in the pod writing there). Before this test, ENOSPC in a fetch was
an untyped ``InternalError``, retried five times and then ``Failed`` until the next
snapshot, with partial files left; now the pod says ``Loading`` with reason ``DiskFull``
while there is no room (never Failed), serves its last snapshot on, and reaches the target
once space returns, with nothing half-written left in staging.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.local.trainer import PublishedSnapshot
from tests.fixtures.small_volume import SmallVolume
from tests.fixtures.trainer import PROBE_TOKENS, Trainer
from tests.integration.sidecar.harness import (
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
)

pytestmark = pytest.mark.cluster

SIZE = "8Mi"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _strays(staging: Path) -> list[str]:
    """What a failed fetch or rebuild may leave: partial downloads, temporary files, half
    rebuilds, and in a buffer anything hidden beside the snapshot's files."""
    partial = (staging / "partial").rglob("*")
    found = [p.relative_to(staging).as_posix() for p in partial if p.is_file()]
    for buffer in (staging / "buffers").iterdir():
        found += [p.relative_to(staging).as_posix() for p in buffer.rglob(".*")]
    found += [p.name for p in staging.glob(".*") if p.name != ".filler"]
    found += [p.relative_to(staging).as_posix() for p in (staging / "fetch").rglob(".*")]
    return sorted(found)


async def _waits_with(
    harness: SidecarHarness, replica: Replica, snapshot: PublishedSnapshot, phase: str
) -> None:
    """The pod says Loading with reason DiskFull, /status says so, transient; never Failed."""

    def why() -> dict[str, str] | None:
        notes = harness.annotations(replica.pod)
        assert notes.get("hotload.dev/state") != "Failed", notes
        return notes if notes.get("hotload.dev/reason") == "DiskFull" else None

    try:
        notes = await eventually(why, timeout=30, what=f"DiskFull on the pod ({phase})")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{harness.log(replica, 'sidecar')}") from None
    assert notes["hotload.dev/target"] == snapshot.identity
    assert notes["hotload.dev/state"] == "Loading"
    assert "no space left" in notes["hotload.dev/message"]
    assert "hotload.dev/failed-snapshot" not in notes
    error = (await harness.status(replica))["lastError"]
    assert error["reason"] == "DiskFull" and error["transient"] is True
    assert error["target"] == snapshot.identity


async def test_a_full_staging_volume_waits_as_disk_full_and_loads_once_space_returns(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    harness.create_deployment(rollout_deployment("full-disk", bucket_url))
    replica = await harness.replica("full-disk-0", "full-disk", staging_size_limit=SIZE)
    staging = replica.staging.resolve()
    volume = SmallVolume(staging, 8 << 20)
    assert volume.free() <= 8 << 20, "the runtime did not size the staging tmpfs"
    first = await trainer.publish_full()
    harness.set_target("full-disk", first.ref())
    await harness.wait_state(replica, first.identity, "Ready")
    model = _size(staging / "buffers")

    # 1. Room to fetch the next Full but not to rebuild it (the free buffer is empty).
    trainer.train_step()
    second = await trainer.publish_full()
    volume.fill(leave=_stored(second) + model // 3)
    harness.set_target("full-disk", second.ref())
    await _waits_with(harness, replica, second, "rebuild")
    assert _strays(staging) == []
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["identity"] == first.identity, "the replica stopped serving its snapshot"
    volume.release()
    await harness.wait_state(replica, second.identity, "Ready", timeout=60)
    assert "hotload.dev/reason" not in harness.annotations(replica.pod)

    # 2. No room to fetch the next Full (it needs about a model's bytes).
    trainer.train_step()
    third = await trainer.publish_full()
    volume.fill(leave=model // 3)
    harness.set_target("full-disk", third.ref())
    await _waits_with(harness, replica, third, "fetch")
    assert _strays(staging) == []
    volume.release()
    await harness.wait_state(replica, third.identity, "Ready", timeout=60)
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["sha256"] == trainer.expected_logits(third).sha256
    assert _strays(staging) == []


def _stored(snapshot: PublishedSnapshot) -> int:
    """Bytes the snapshot stores in the bucket (what fetching it needs, pages aside)."""
    return snapshot.stored_bytes + 64 * 1024
