"""The golden vectors (tests/golden/snapshot): what defines conformance to hotload-delta/v1.

Another implementation passes if it rebuilds every vector to the expected files. Ours
must also reproduce the vectors byte for byte (the encoder is deterministic with the
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
EXPECTED: dict[str, dict[str, str]] = json.loads((GOLDEN / "expected.json").read_text())
SNAPSHOTS = sorted(EXPECTED)


def hashes(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != REBUILT_NAME
    }


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_golden_vector_rebuilds_to_the_expected_files(name: str, tmp_path: Path) -> None:
    verify(GOLDEN / name)
    previous = None if name == "full" else GOLDEN / "previous"
    rebuild(previous, GOLDEN / name, tmp_path / "out")
    assert hashes(tmp_path / "out") == EXPECTED[name]


def test_golden_delta_rebuilds_the_current_model() -> None:
    assert EXPECTED["delta"] == hashes(GOLDEN / "current")
    assert EXPECTED["full"] == hashes(GOLDEN / "previous")


def test_golden_vectors_cover_every_codec() -> None:
    used = {tensor.codec for name in SNAPSHOTS for tensor in read_manifest(GOLDEN / name).tensors}
    assert used == set(CodecId)


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
