"""``hotload snapshot encode|decode|verify|inspect`` as a user runs them: subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.snapshot.models import base_tensors, next_step, write_model

REPO = Path(__file__).resolve().parents[3]
ENTRY = "import sys; sys.argv[0] = 'hotload'; from hotload.cli import main; main()"


def hotload(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``hotload ARGS`` as a process, running this checkout's code (the console script
    may point at another installed copy)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", ENTRY, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_encode_decode_verify_inspect(tmp_path: Path) -> None:
    tensors = base_tensors()
    v1 = write_model(tmp_path / "v1", {"model.safetensors": tensors})
    v2 = write_model(tmp_path / "v2", {"model.safetensors": next_step(tensors)})

    full = hotload("snapshot", "encode", "--current", v1, "--out", tmp_path / "s1", "--step", "1")
    assert full.returncode == 0, full.stderr
    assert "Full snapshot s1 (step 1)" in full.stdout
    decoded = hotload("snapshot", "decode", "--snapshot", tmp_path / "s1", "--out", tmp_path / "r1")
    assert decoded.returncode == 0, decoded.stderr

    # identity and step default from the out directory and the previous rebuild's record
    delta = hotload(
        "snapshot",
        "encode",
        "--previous",
        tmp_path / "r1",
        "--current",
        v2,
        "--out",
        tmp_path / "s2",
        "-o",
        "json",
    )
    assert delta.returncode == 0, delta.stderr
    summary = json.loads(delta.stdout)
    assert summary["kind"] == "Incremental" and summary["previous"] == "s1"
    assert summary["step"] == 2 and summary["ratio"] > 1

    verified = hotload("snapshot", "verify", tmp_path / "s2")
    assert verified.returncode == 0 and "ok" in verified.stdout

    inspected = json.loads(hotload("snapshot", "inspect", tmp_path / "s2", "-o", "json").stdout)
    embed = next(t for t in inspected["tensors"] if t["name"] == "embed.weight")
    assert embed["codec"] in ("sparse", "context") and embed["changedFraction"] > 0
    assert inspected["storedBytes"] == sum(p.stat().st_size for p in (tmp_path / "s2").iterdir())
    as_yaml = yaml.safe_load(hotload("snapshot", "inspect", tmp_path / "s2", "-o", "yaml").stdout)
    assert as_yaml == inspected
    table = hotload("snapshot", "inspect", tmp_path / "s2").stdout
    # the table names each tensor's codec as the JSON does (the encoder picks per tensor)
    embed_row = next(line for line in table.splitlines() if line.startswith("embed.weight"))
    assert embed["codec"] in embed_row.split() and "ratio" in table

    rebuilt = hotload(
        "snapshot",
        "decode",
        "--previous",
        tmp_path / "r1",
        "--snapshot",
        tmp_path / "s2",
        "--out",
        tmp_path / "r2",
        "--threads",
        "2",
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (tmp_path / "r2" / "model.safetensors").read_bytes() == (
        v2 / "model.safetensors"
    ).read_bytes()


def test_corrupt_snapshot_exits_1_with_one_line(tmp_path: Path) -> None:
    tensors = base_tensors()
    v1 = write_model(tmp_path / "v1", {"model.safetensors": tensors})
    assert hotload("snapshot", "encode", "--current", v1, "--out", tmp_path / "s1").returncode == 0
    shard = tmp_path / "s1" / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = hotload("snapshot", "verify", tmp_path / "s1")
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error [ChecksumMismatch]: file hash differs")
    )
    failed = hotload("snapshot", "decode", "--snapshot", tmp_path / "s1", "--out", tmp_path / "r")
    assert failed.returncode == 1 and not (tmp_path / "r").exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert hotload("snapshot", "encode", "--out", tmp_path / "x").returncode == 2
