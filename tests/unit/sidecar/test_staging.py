"""The staging volume: what counts as a verified rebuild, and what cleaning keeps."""

from __future__ import annotations

import json
from pathlib import Path

from hotload.api import SnapshotKind
from hotload.sidecar.staging import StagingArea
from hotload.snapshot import REBUILT_NAME


def _rebuilt(staging: StagingArea, identity: str, step: int = 3) -> None:
    directory = staging.snapshot_dir(identity)
    directory.mkdir(parents=True)
    record = {"identity": identity, "step": step, "kind": "Incremental", "tensorDigest": "0" * 32}
    (directory / REBUILT_NAME).write_text(json.dumps(record))


def test_only_a_directory_whose_record_names_it_is_a_verified_snapshot(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    _rebuilt(staging, "s-3")
    record = staging.record("s-3")
    assert record is not None and record.step == 3 and record.kind is SnapshotKind.INCREMENTAL
    staging.snapshot_dir("s-4").mkdir()
    assert not staging.has_snapshot("s-4"), "no record: a rebuild that never finished"
    (staging.snapshot_dir("s-4") / REBUILT_NAME).write_text('{"identity": "s-3", "step": 3}')
    assert not staging.has_snapshot("s-4"), "a record naming another snapshot"


def test_prepare_drops_rebuilds_left_half_done(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    partial = tmp_path / "snapshots" / ".s-5.partial-x1y2"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    _rebuilt(staging, "s-4")
    staging.prepare()
    assert not partial.exists()
    assert staging.has_snapshot("s-4")


def test_clean_keeps_the_served_snapshot_and_drops_the_rest(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    for identity in ("s-1", "s-2"):
        _rebuilt(staging, identity)
        staging.fetch_dir(identity).mkdir(parents=True)
    removed = staging.clean({"s-2"}, set())
    assert sorted(removed) == ["fetch/s-1", "fetch/s-2", "snapshots/s-1"]
    assert staging.has_snapshot("s-2") and not staging.has_snapshot("s-1")


def test_the_engine_is_handed_the_mount_path_not_the_host_path(tmp_path: Path) -> None:
    assert str(StagingArea(tmp_path).engine_path("s-2")) == "/var/lib/hotload/staging/snapshots/s-2"
