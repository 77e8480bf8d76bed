"""Rebuilding a delta by patching the previous directory in place (consume_previous)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from hotload.errors import ChecksumMismatch, DecodeFailed, ManifestInvalid
from hotload.snapshot import REBUILT_NAME, encode, encode_full, rebuild
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.safetensors_file import build_header, length_prefix

from . import tampering
from .conftest import SMALL_CHUNKS, Chain, leftovers
from .models import base_tensors, next_step, write_model
from .test_encode_decode import same_files


def snapshot_of(directory: Path) -> dict[str, str]:
    """Every file (hidden ones included) and its sha256: what 'unchanged' means."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_consuming_rebuild_turns_the_previous_into_the_target(chain: Chain) -> None:
    out = chain.root / "r2"
    rebuild(chain.rebuilt_v1, chain.snapshot, out, consume_previous=True)
    same_files(chain.v2, out)
    assert not chain.rebuilt_v1.exists()
    assert json.loads((out / REBUILT_NAME).read_text())["identity"] == "s2"
    assert leftovers(chain.root) == []
    assert not [p for p in out.rglob(".*")], "backups left in the rebuilt directory"


def test_failed_consuming_rebuild_restores_the_previous_exactly(chain: Chain) -> None:
    before = snapshot_of(chain.rebuilt_v1)
    document = tampering.load(chain.snapshot)
    entry = tampering.tensor(document, "quant.weight")  # late in the file: earlier ones patched
    payload = bytearray(tampering.read_range(chain.snapshot, entry["data"]))
    payload[-1] ^= 0x10
    tampering.replace_range(chain.snapshot, entry["data"], bytes(payload))
    tampering.resign(chain.snapshot, lambda d: d.update(tensors=document["tensors"]))
    out = chain.root / "r2"
    with pytest.raises((ChecksumMismatch, DecodeFailed)):
        rebuild(chain.rebuilt_v1, chain.snapshot, out, consume_previous=True)
    assert not out.exists()
    assert snapshot_of(chain.rebuilt_v1) == before
    assert leftovers(chain.root) == []


def test_consuming_rebuild_swaps_changed_files_and_drops_removed_ones(tmp_path: Path) -> None:
    tensors = base_tensors()
    v1 = write_model(
        tmp_path / "v1",
        {"model.safetensors": tensors},
        config={"a": 1, "tv": "1"},
        extra_files={"tokenizer.json": "{}", "old.txt": "gone"},
    )
    v2 = write_model(
        tmp_path / "v2",
        {"model.safetensors": next_step(tensors)},
        config={"a": 1, "tv": "2"},
        extra_files={"tokenizer.json": "{}", "new.txt": "here"},
    )
    encode_full(v1, tmp_path / "s1", identity="s1", step=1)
    rebuild(None, tmp_path / "s1", tmp_path / "r1")
    encode(
        tmp_path / "r1",
        v2,
        tmp_path / "s2",
        identity="s2",
        step=2,
        previous_identity="s1",
        ignored_config_fields=["tv"],
        options=SMALL_CHUNKS,
    )
    rebuild(tmp_path / "r1", tmp_path / "s2", tmp_path / "r2", consume_previous=True)
    same_files(v2, tmp_path / "r2")


def test_config_change_outside_ignored_fields_restores_the_previous(tmp_path: Path) -> None:
    tensors = base_tensors()
    v1 = write_model(tmp_path / "v1", {"model.safetensors": tensors}, config={"a": 1, "tv": "1"})
    v2 = write_model(tmp_path / "v2", {"model.safetensors": tensors}, config={"a": 1, "tv": "2"})
    encode_full(v1, tmp_path / "s1", identity="s1", step=1)
    rebuild(None, tmp_path / "s1", tmp_path / "r1")
    encode(
        tmp_path / "r1",
        v2,
        tmp_path / "s2",
        identity="s2",
        step=2,
        previous_identity="s1",
        ignored_config_fields=["tv"],
    )
    before = snapshot_of(tmp_path / "r1")
    (tmp_path / "r1" / "config.json").write_text(json.dumps({"a": 2, "tv": "1"}))
    changed = snapshot_of(tmp_path / "r1")
    tampering.resign(tmp_path / "s2")
    with pytest.raises(ManifestInvalid):
        rebuild(tmp_path / "r1", tmp_path / "s2", tmp_path / "r2", consume_previous=True)
    assert snapshot_of(tmp_path / "r1") == changed != before


def test_resharded_delta_falls_back_to_a_fresh_rebuild(tmp_path: Path) -> None:
    tensors = base_tensors()
    names = list(tensors)
    v1 = write_model(tmp_path / "v1", {"model.safetensors": tensors})
    moved = next_step(tensors)
    v2 = write_model(
        tmp_path / "v2",
        {
            "model-00001-of-00002.safetensors": {n: moved[n] for n in names[:3]},
            "model-00002-of-00002.safetensors": {n: moved[n] for n in names[3:]},
        },
    )
    encode_full(v1, tmp_path / "s1", identity="s1", step=1)
    rebuild(None, tmp_path / "s1", tmp_path / "r1")
    encode(tmp_path / "r1", v2, tmp_path / "s2", identity="s2", step=2, previous_identity="s1")
    rebuild(tmp_path / "r1", tmp_path / "s2", tmp_path / "r2", consume_previous=True)
    same_files(v2, tmp_path / "r2")
    assert (tmp_path / "r1" / "model.safetensors").exists()  # not consumed


def test_a_chain_replays_in_place(tmp_path: Path) -> None:
    versions = [base_tensors()]
    for step in range(4):
        versions.append(next_step(versions[-1], seed=step))
    dirs = [
        write_model(tmp_path / f"v{i}", {"model.safetensors": v}) for i, v in enumerate(versions)
    ]
    encode_full(dirs[0], tmp_path / "s0", identity="s0", step=0)
    held = tmp_path / "r0"
    rebuild(None, tmp_path / "s0", held)
    for i in range(1, len(dirs)):
        encode(
            held,
            dirs[i],
            tmp_path / f"s{i}",
            identity=f"s{i}",
            step=i,
            previous_identity=f"s{i - 1}",
        )
        rebuild(held, tmp_path / f"s{i}", tmp_path / f"r{i}", consume_previous=True)
        held = tmp_path / f"r{i}"
    same_files(dirs[-1], held)


# --- headers that changed: metadata (same or another length), or the layout --------------


def _write_with_metadata(path: Path, tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    header, _ = build_header(
        [(name, DTYPES[dtype], tuple(data.shape)) for name, (dtype, data) in tensors.items()],
        metadata,
    )
    with path.open("wb") as handle:
        handle.write(length_prefix(header) + header)
        for _, data in tensors.values():
            handle.write(data.tobytes())


def _two_steps(root: Path, first: dict[str, str], second: dict[str, str]) -> tuple[Path, Path]:
    """A rebuilt previous (shards a and b, metadata ``first`` in a) and a delta to the next
    step whose shard a carries metadata ``second``."""
    tensors = base_tensors()
    names = list(tensors)
    moved = next_step(tensors)
    v1 = write_model(root / "v1", {"a.safetensors": {}, "b.safetensors": {}})
    v2 = write_model(root / "v2", {"a.safetensors": {}, "b.safetensors": {}})
    _write_with_metadata(v1 / "a.safetensors", {n: tensors[n] for n in names[:3]}, first)
    _write_with_metadata(v1 / "b.safetensors", {n: tensors[n] for n in names[3:]}, {})
    _write_with_metadata(v2 / "a.safetensors", {n: moved[n] for n in names[:3]}, second)
    _write_with_metadata(v2 / "b.safetensors", {n: moved[n] for n in names[3:]}, {})
    encode_full(v1, root / "s1", identity="s1", step=1)
    rebuild(None, root / "s1", root / "r1")
    encode(root / "r1", v2, root / "s2", identity="s2", step=2, previous_identity="s1")
    return v2, root / "r1"


@pytest.mark.parametrize(
    ("first", "second", "same_file"),
    [
        ({"step": "1"}, {"step": "2"}, True),  # same header length: overwritten in place
        ({"step": "1"}, {"step": "1" + "0" * 40}, False),  # longer: the shard is rewritten
    ],
)
def test_metadata_change_is_patched_in_place(
    tmp_path: Path, first: dict[str, str], second: dict[str, str], same_file: bool
) -> None:
    v2, previous = _two_steps(tmp_path, first, second)
    inode_a = (previous / "a.safetensors").stat().st_ino
    inode_b = (previous / "b.safetensors").stat().st_ino
    rebuild(previous, tmp_path / "s2", tmp_path / "r2", consume_previous=True)
    same_files(v2, tmp_path / "r2")
    assert not previous.exists(), "a fresh copy was made instead of patching in place"
    assert ((tmp_path / "r2" / "a.safetensors").stat().st_ino == inode_a) is same_file
    assert (tmp_path / "r2" / "b.safetensors").stat().st_ino == inode_b
    assert not [p for p in (tmp_path / "r2").rglob(".*")]


@pytest.mark.parametrize("second", [{"step": "2"}, {"step": "2" * 40}])
def test_failed_patch_after_a_header_change_restores_the_previous(
    tmp_path: Path, second: dict[str, str]
) -> None:
    _, previous = _two_steps(tmp_path, {"step": "1"}, second)
    before = snapshot_of(previous)

    def corrupt_last_payload(document: tampering.Document) -> None:
        last = [t for t in document["tensors"] if "data" in t][-1]
        data = bytearray(tampering.read_range(tmp_path / "s2", last["data"]))
        data[-1] ^= 0xFF
        tampering.replace_range(tmp_path / "s2", last["data"], bytes(data))

    tampering.resign(tmp_path / "s2", corrupt_last_payload)
    with pytest.raises((ChecksumMismatch, DecodeFailed)):
        rebuild(previous, tmp_path / "s2", tmp_path / "r2", consume_previous=True)
    assert snapshot_of(previous) == before
    assert not (tmp_path / "r2").exists()


def test_a_changed_shape_falls_back_to_a_fresh_rebuild(tmp_path: Path) -> None:
    tensors = base_tensors()
    moved = dict(next_step(tensors))
    moved["embed.weight"] = ("BF16", moved["embed.weight"][1].reshape(-1)[:1024].reshape(32, 32))
    v1 = write_model(tmp_path / "v1", {"model.safetensors": tensors})
    v2 = write_model(tmp_path / "v2", {"model.safetensors": moved})
    encode_full(v1, tmp_path / "s1", identity="s1", step=1)
    rebuild(None, tmp_path / "s1", tmp_path / "r1")
    encode(tmp_path / "r1", v2, tmp_path / "s2", identity="s2", step=2, previous_identity="s1")
    rebuild(tmp_path / "r1", tmp_path / "s2", tmp_path / "r2", consume_previous=True)
    same_files(v2, tmp_path / "r2")
    assert (tmp_path / "r1").exists(), "the layout changed: the previous must stay as it was"
