"""The golden vectors: what defines conformance to hotload-delta/v3 (tests/golden/snapshot)
and, for reading, to v1 and v2 (tests/golden/snapshot-v1, tests/golden/snapshot-v2, frozen).

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
    assert read_manifest(GOLDEN / name).format == "hotload-delta/v3"
    previous = None if name == "full" else GOLDEN / "previous"
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


def test_golden_vectors_cover_every_codec() -> None:
    used = {tensor.codec for name in SNAPSHOTS for tensor in read_manifest(GOLDEN / name).tensors}
    assert used == set(CodecId)
    v1 = {t.codec for name in EXPECTED_V1 for t in read_manifest(GOLDEN_V1 / name).tensors}
    assert v1 == set(CodecId) - {CodecId.CONTEXT}
    v2 = {t.codec for name in EXPECTED_V2 for t in read_manifest(GOLDEN_V2 / name).tensors}
    assert v2 == set(CodecId)


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
