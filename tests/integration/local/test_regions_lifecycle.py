"""``hotload local up|status|down`` end to end, on a state directory of their own: the
second ``up`` finds the regions up and builds nothing, ``down`` leaves no process and no
port, and an index held by live regions elsewhere is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hotload.errors import RegionIndexTaken
from hotload.local import LocalRegions, up
from hotload.local.claims import held_by
from hotload.local.ports import is_listening
from hotload.local.processes import ProcessRecord, group_members, is_alive, read_records
from hotload.local.tools import bin_dir

pytestmark = pytest.mark.cluster

HOTLOAD = str(Path(sys.executable).parent / "hotload")
#: Bases tried for this test's own region (another live run may hold one).
OWN_INDEX_BASES = range(151, 200)


def _hotload(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HOTLOAD, "--log-level", "warning", "local", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )


def _cached_binaries() -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in bin_dir().iterdir()}


def _up_somewhere_free(state: Path) -> tuple[int, subprocess.CompletedProcess[str]]:
    for base in OWN_INDEX_BASES:
        result = _hotload(
            "up",
            "--regions",
            "1",
            "--nodes",
            "1",
            "--index-base",
            str(base),
            "--state-dir",
            str(state),
        )
        if "is used by live regions" not in result.stderr:
            return base, result
    pytest.fail("no free region index in 151..199")


def test_cli_up_is_idempotent_reuses_the_cache_and_down_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    binaries = _cached_binaries()

    base, first = _up_somewhere_free(state)
    assert first.returncode == 0, first.stderr
    assert f"pods 127.{base}.0.0/16" in first.stdout
    assert f"export KUBECONFIG={state / 'kubeconfig'}" in first.stdout

    shown = _hotload("status", "--state-dir", str(state), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    (region,) = json.loads(shown.stdout)
    assert region["name"] == "region-1" and region["index"] == base
    assert set(region["processes"]) >= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    assert all(region["processes"].values())
    assert (region["nodesReady"], region["nodesTotal"]) == (1, 1)
    assert region["services"] == {}
    table = _hotload("status", "--state-dir", str(state))
    assert table.stdout.splitlines()[0].split()[:3] == ["REGION", "INDEX", "APISERVER"]

    records = read_records(state / "region-1" / "pids")
    again = _hotload(
        "up", "--regions", "1", "--nodes", "1", "--index-base", str(base), "--state-dir", str(state)
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout  # same regions, same ports: nothing restarted
    assert read_records(state / "region-1" / "pids") == records
    assert _cached_binaries() == binaries  # a second up builds nothing
    assert held_by(state.resolve()) == [base]

    ports = [port for record in records for port in record.ports]
    assert ports and all(is_listening(port) for port in ports)
    gone = _hotload("down", "--state-dir", str(state))
    assert gone.returncode == 0, gone.stderr

    _assert_nothing_left(records)
    assert held_by(state.resolve()) == []
    assert not (state / "regions.json").exists() and not (state / "kubeconfig").exists()
    assert not (state / "region-1" / "etcd").exists()
    assert (state / "region-1" / "logs" / "kube-apiserver.log").stat().st_size > 0  # logs stay
    status = _hotload("status", "--state-dir", str(state))
    assert status.returncode == 1 and "no local regions are up" in status.stdout
    assert _hotload("down", "--state-dir", str(state)).returncode == 0  # down on nothing is fine


def _assert_nothing_left(records: list[ProcessRecord]) -> None:
    assert records
    for record in records:
        assert not is_alive(record), f"{record.name} still runs"
        assert group_members(record.pid) == [], f"{record.name}'s process group still has members"
        for port in record.ports:
            assert not is_listening(port), f"port {port} of {record.name} still taken"


def test_up_refuses_an_index_that_live_regions_hold(
    local_regions: LocalRegions, tmp_path: Path
) -> None:
    taken = local_regions["region-2"].index
    with pytest.raises(RegionIndexTaken) as refused:
        up(regions=1, state_dir=tmp_path / "other", index_base=taken)
    assert refused.value.context["state_dir"] == str(local_regions.state_dir)
    assert not (tmp_path / "other" / "regions.json").exists()
    assert list((tmp_path / "other").glob("*/pids/*.json")) == []
    assert held_by(local_regions.state_dir) == [region.index for region in local_regions.regions]
