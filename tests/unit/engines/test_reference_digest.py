"""The reference engine's weights digest is the snapshot's manifest digest when it serves
that snapshot bit for bit (what a sidecar compares after each swap), and only then."""

from __future__ import annotations

from pathlib import Path

from hotload.api import SnapshotKind
from hotload.engines.reference import model as rm
from hotload.engines.reference.runtime import ReferenceRuntime
from hotload.snapshot import encode_full, manifest_digest, read_manifest


async def test_digest_equals_the_manifest_digest_of_the_served_snapshot(tmp_path: Path) -> None:
    config = rm.build_config("tiny")
    rm.save_snapshot(rm.build_model(config, seed=3), tmp_path / "weights")
    encode_full(tmp_path / "weights", tmp_path / "snapshot", identity="s-1", step=1)
    expected = manifest_digest(read_manifest(tmp_path / "snapshot"))

    runtime = ReferenceRuntime(config)
    before = runtime.describe()
    assert before["loaded"] is False and before["instance_id"]
    assert await runtime.tensor_digest() != expected, "the seeded init is other weights"
    await runtime.load(tmp_path / "weights", "s-1", SnapshotKind.FULL)
    assert await runtime.tensor_digest() == expected
    assert runtime.describe()["loaded"] is True
    assert ReferenceRuntime(config).instance_id != runtime.instance_id
