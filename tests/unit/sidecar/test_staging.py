"""The staging volume: what counts as a verified rebuild, the buffers' roles, cleaning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotload.api import SnapshotKind
from hotload.engines.reference import model as rm
from hotload.errors import ChecksumMismatch
from hotload.sidecar.planning import Slot
from hotload.sidecar.staging import StagingArea, directory_digest
from hotload.snapshot import REBUILT_NAME, encode_full, rebuild


def _record(directory: Path, identity: str, step: int = 3, digest: str = "0" * 32) -> None:
    directory.mkdir(parents=True)
    record = {"identity": identity, "step": step, "kind": "Incremental", "tensorDigest": digest}
    (directory / REBUILT_NAME).write_text(json.dumps(record))


def test_only_a_directory_whose_record_names_it_is_a_verified_rebuild(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    assert staging.held(Slot.A) is None
    staging.snapshot_dir(Slot.A, "s-4").mkdir()
    assert staging.held(Slot.A) is None, "no record: a rebuild that never finished"
    (staging.snapshot_dir(Slot.A, "s-4") / REBUILT_NAME).write_text('{"identity": "s-3"}')
    assert staging.held(Slot.A) is None, "a record naming another snapshot"
    _record(staging.snapshot_dir(Slot.B, "s-3"), "s-3")
    held = staging.held(Slot.B)
    assert held is not None and (held.step, held.kind) == (3, SnapshotKind.INCREMENTAL)


def test_prepare_drops_rebuilds_left_half_done(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    partial = staging.slot_dir(Slot.B) / ".s-5.partial-x1y2"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    _record(staging.snapshot_dir(Slot.B, "s-4"), "s-4")
    staging.prepare()
    assert not partial.exists()
    assert staging.held(Slot.B) is not None


def test_roles_survive_a_restart_and_default_to_none(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    assert (staging.roles().served, staging.roles().handed) == (None, None)
    staging.set_roles(Slot.A, Slot.B)
    again = StagingArea(tmp_path)
    assert (again.roles().served, again.roles().handed) == (Slot.A, Slot.B)
    (tmp_path / "buffers.json").write_text("{broken")
    assert again.roles().served is None


def test_clean_keeps_what_is_asked_and_partials_live_apart(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    for identity in ("s-1", "s-2"):
        staging.fetch_dir(identity).mkdir(parents=True)
        staging.partial_dir(identity).mkdir(parents=True)
    assert staging.partial_dir("s-1") != staging.fetch_dir("s-1")
    removed = staging.clean_fetches({"s-2"})
    assert sorted(removed) == ["fetch/s-1", "partial/s-1"]
    assert staging.fetch_dir("s-2").is_dir()


def test_each_snapshot_is_handed_at_its_own_mount_path(tmp_path: Path) -> None:
    path = StagingArea(tmp_path).engine_path(Slot.B, "s-2")
    assert str(path) == "/var/lib/hotload/staging/buffers/b/s-2"


def test_verify_catches_a_bit_flipped_in_a_staged_rebuild(tmp_path: Path) -> None:
    config = rm.build_config("tiny")
    rm.save_snapshot(rm.build_model(config, seed=1), tmp_path / "weights")
    encode_full(tmp_path / "weights", tmp_path / "snapshot", identity="s-1", step=1)
    staging = StagingArea(tmp_path / "staging")
    staging.prepare()
    out = staging.snapshot_dir(Slot.A, "s-1")
    rebuild(None, tmp_path / "snapshot", out)
    held = staging.held(Slot.A)
    assert held is not None and held.digest == directory_digest(out)
    staging.verify(Slot.A, held)
    shard = out / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x04
    shard.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        staging.verify(Slot.A, held)
