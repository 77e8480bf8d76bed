"""The golden vectors: what defines conformance to hotload-delta/v3 and v4 (tests/golden/
snapshot; v4's are ``parts-*``) and, for reading, to v1 and v2 (tests/golden/snapshot-v1,
tests/golden/snapshot-v2, frozen).

Another implementation passes if it rebuilds every vector to the expected files. Ours
must also reproduce the v3 vectors byte for byte (the encoder is deterministic with the
pinned zstandard; regenerate with tests/golden/snapshot/generate.py after a deliberate
format change).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hotload.snapshot import REBUILT_NAME, CodecId, read_manifest, rebuild, verify
from hotload.snapshot.tensor_files import mapped_shards

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "snapshot"
GOLDEN_V1 = Path(__file__).resolve().parents[2] / "golden" / "snapshot-v1"
GOLDEN_V2 = Path(__file__).resolve().parents[2] / "golden" / "snapshot-v2"
EXPECTED: dict[str, dict[str, str]] = json.loads((GOLDEN / "expected.json").read_text())
SNAPSHOTS = sorted(EXPECTED)
EXPECTED_V1: dict[str, dict[str, str]] = json.loads((GOLDEN_V1 / "expected.json").read_text())
EXPECTED_V2: dict[str, dict[str, str]] = json.loads((GOLDEN_V2 / "expected.json").read_text())


def hashes(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != REBUILT_NAME
    }


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_golden_vector_rebuilds_to_the_expected_files(name: str, tmp_path: Path) -> None:
    verify(GOLDEN / name)
    parted = name.startswith("parts-")
    assert read_manifest(GOLDEN / name).format == (
        "hotload-delta/v4" if parted else "hotload-delta/v3"
    )
    previous = None if name.endswith("full") else GOLDEN / "previous"
    rebuild(previous, GOLDEN / name, tmp_path / "out")
    assert hashes(tmp_path / "out") == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_V1))
def test_v1_golden_vectors_still_rebuild(name: str, tmp_path: Path) -> None:
    verify(GOLDEN_V1 / name)
    assert read_manifest(GOLDEN_V1 / name).format == "hotload-delta/v1"
    previous = None if name == "full" else GOLDEN_V1 / "previous"
    rebuild(previous, GOLDEN_V1 / name, tmp_path / "out")
    assert hashes(tmp_path / "out") == EXPECTED_V1[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_V2))
def test_v2_golden_vectors_still_rebuild(name: str, tmp_path: Path) -> None:
    verify(GOLDEN_V2 / name)
    manifest = read_manifest(GOLDEN_V2 / name)
    assert manifest.format == "hotload-delta/v2"
    assert all(f.hash is not None for f in manifest.referenced)
    previous = None if name == "full" else GOLDEN_V2 / "previous"
    rebuild(previous, GOLDEN_V2 / name, tmp_path / "out")
    assert hashes(tmp_path / "out") == EXPECTED_V2[name]


def test_golden_delta_rebuilds_the_current_model() -> None:
    assert EXPECTED["delta"] == hashes(GOLDEN / "current")
    assert EXPECTED["full"] == hashes(GOLDEN / "previous")


@pytest.mark.parametrize(("parted", "whole"), [("parts-full", "full"), ("parts-delta", "delta")])
def test_golden_parts_rebuild_the_same_weights_as_whole_tensors(
    parted: str, whole: str, tmp_path: Path
) -> None:
    """The parted vectors hold the same model: the same files but the shard, which holds
    the same tensors (laid out sorted by name, as a state_dict is written)."""
    previous = None if whole == "full" else GOLDEN / "previous"
    rebuild(previous, GOLDEN / parted, tmp_path / "parted")
    rebuild(previous, GOLDEN / whole, tmp_path / "whole")
    assert {k: v for k, v in EXPECTED[parted].items() if k != "model.safetensors"} == {
        k: v for k, v in EXPECTED[whole].items() if k != "model.safetensors"
    }
    with (
        mapped_shards(tmp_path / "parted", ["model.safetensors"]) as a,
        mapped_shards(tmp_path / "whole", ["model.safetensors"]) as b,
    ):
        assert sorted(a.by_name) == sorted(b.by_name)
        for name in a.by_name:
            assert bytes(a.by_name[name][0].raw(a.by_name[name][1])) == bytes(
                b.by_name[name][0].raw(b.by_name[name][1])
            ), name
        assert [t.name for t in a.shards["model.safetensors"].header.tensors] == sorted(a.by_name)


def test_golden_vectors_cover_every_codec() -> None:
    used = {tensor.codec for name in SNAPSHOTS for tensor in read_manifest(GOLDEN / name).tensors}
    assert used == set(CodecId)
    in_parts = {
        part.codec
        for name in SNAPSHOTS
        for tensor in read_manifest(GOLDEN / name).tensors
        for part in tensor.parts or ()
    }
    assert in_parts >= {CodecId.STORED, CodecId.UNCHANGED, CodecId.CONTEXT, CodecId.DENSE_SUB}
    v1 = {t.codec for name in EXPECTED_V1 for t in read_manifest(GOLDEN_V1 / name).tensors}
    assert v1 == set(CodecId) - {CodecId.CONTEXT, CodecId.PARTS}
    v2 = {t.codec for name in EXPECTED_V2 for t in read_manifest(GOLDEN_V2 / name).tensors}
    assert v2 == set(CodecId) - {CodecId.PARTS}


def test_encoder_reproduces_the_golden_vectors(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("golden_generate", GOLDEN / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(tmp_path)
    for name in [*SNAPSHOTS, "previous", "current"]:
        ours = {p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*")}
        golden = {p.relative_to(GOLDEN / name) for p in (GOLDEN / name).rglob("*")}
        assert ours == golden, name
        for relative in golden:
            if (GOLDEN / name / relative).is_file():
                assert (tmp_path / name / relative).read_bytes() == (
                    GOLDEN / name / relative
                ).read_bytes(), f"{name}/{relative}"
