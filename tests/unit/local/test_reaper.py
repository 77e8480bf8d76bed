"""The reaper takes regions down once their owner dies without doing it itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hotload.local import processes
from hotload.local.processes import ProcessSpec, Wave
from hotload.local.reaper import start_reaper


def test_regions_of_a_killed_owner_are_taken_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLOAD_CACHE", str(tmp_path / "cache"))
    state = tmp_path / "state"
    region_dir = state / "region-1"
    spec = ProcessSpec(
        name="etcd",
        argv=("sleep", "300"),
        wave=Wave.STORAGE,
        ready=lambda: True,
        ready_what="always",
    )
    leftover = processes.start(spec, region_dir / "logs", region_dir / "pids")
    owner = subprocess.Popen(["sleep", "300"])
    reaper = start_reaper(state, owner.pid)
    try:
        assert processes.is_alive(leftover)
        owner.kill()
        owner.wait()
        assert reaper.wait(timeout=30) == 0
        assert not processes.is_alive(leftover)
        assert list((region_dir / "pids").glob("*.json")) == []
    finally:
        reaper.kill()
        processes.stop([leftover])
