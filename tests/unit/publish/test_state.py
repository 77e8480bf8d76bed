"""The publisher's work directory: one publisher at a time, state that survives restarts.

Would catch: two trainers publishing from one directory (interleaved chains), a restart
that forgets what a region still has to get, a delta against weights that are gone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotload.api import SnapshotKind
from hotload.errors import ConfigError
from hotload.publish.state import LastSnapshot, PendingSnapshot, PublisherState, WorkDir


def test_a_second_publisher_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first, second = WorkDir(tmp_path), WorkDir(tmp_path)
    first.lock()
    try:
        with pytest.raises(ConfigError, match="another publisher"):
            second.lock()
    finally:
        first.unlock()
    second.lock()
    second.unlock()


def test_state_round_trips_with_the_queue_of_each_region(tmp_path: Path) -> None:
    workdir = WorkDir(tmp_path)
    weights = workdir.weights("run-step-3")
    weights.mkdir(parents=True)
    state = PublisherState(
        deployment="demo",
        namespace="ns",
        last=LastSnapshot(
            identity="run-step-3",
            step=3,
            kind=SnapshotKind.INCREMENTAL,
            last_full_step=0,
            weights=str(weights),
        ),
        chain=["run-step-0-full", "run-step-3"],
        pending={
            "region-2": [PendingSnapshot(identity="run-step-3", policy_snapshot={}, encoded="/e")]
        },
    )
    workdir.save(state)
    loaded = WorkDir(tmp_path).load("demo", "ns")
    assert loaded == state
    assert loaded.referenced_encoded() == {"/e"}


def test_a_directory_of_another_deployment_is_refused(tmp_path: Path) -> None:
    WorkDir(tmp_path).save(PublisherState(deployment="a", namespace="ns"))
    with pytest.raises(ConfigError, match="another deployment"):
        WorkDir(tmp_path).load("b", "ns")


def test_lost_previous_weights_mean_the_next_snapshot_is_a_full(tmp_path: Path) -> None:
    state = PublisherState(
        deployment="demo",
        namespace="ns",
        last=LastSnapshot(
            identity="x-step-1",
            step=1,
            kind=SnapshotKind.INCREMENTAL,
            last_full_step=0,
            weights=str(tmp_path / "gone"),
        ),
        chain=["x-step-0-full", "x-step-1"],
    )
    WorkDir(tmp_path).save(state)
    loaded = WorkDir(tmp_path).load("demo", "ns")
    assert loaded.last is None and loaded.chain == []


def test_an_unreadable_state_file_says_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable") as caught:
        WorkDir(tmp_path).load("demo", "ns")
    assert caught.value.context["path"] == str(tmp_path / "state.json")


def test_a_queue_written_before_the_rename_is_read(tmp_path: Path) -> None:
    """Earlier versions' state.json names the queued PolicySnapshot ``manifest``."""
    body = {"metadata": {"name": "run-step-3"}}
    old = {
        "deployment": "demo",
        "namespace": "ns",
        "pending": {"region-2": [{"identity": "run-step-3", "manifest": body, "encoded": "/e"}]},
    }
    (tmp_path / "state.json").write_text(json.dumps(old))
    loaded = WorkDir(tmp_path).load("demo", "ns")
    (queued,) = loaded.pending["region-2"]
    assert queued.policy_snapshot == body
    WorkDir(tmp_path).save(loaded)
    assert (
        "policy_snapshot"
        in json.loads((tmp_path / "state.json").read_text())["pending"]["region-2"][0]
    )
