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
from hotload.publish.state import (
    CheckpointRecord,
    LastSnapshot,
    PendingSnapshot,
    PublisherState,
    WorkDir,
)
from hotload.publish.tidying import remember, tidy


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


def _checkpointed_state(workdir: WorkDir) -> PublisherState:
    """A chain whose step-2 weights are on their way beside it as a checkpoint."""
    for identity in ("run-step-1", "run-step-2", "run-step-3"):
        workdir.weights(identity).mkdir(parents=True)
    workdir.encoded("run-step-2-checkpoint").mkdir(parents=True)
    state = PublisherState(deployment="demo", namespace="ns")
    remember(state, "run-step-0-full", 0, SnapshotKind.FULL, workdir.weights("run-step-0-full"))
    remember(state, "run-step-1", 1, SnapshotKind.INCREMENTAL, workdir.weights("run-step-1"))
    remember(
        state,
        "run-step-2",
        2,
        SnapshotKind.INCREMENTAL,
        workdir.weights("run-step-2"),
        checkpoint_begun=True,
    )
    state.checkpoint_pending = CheckpointRecord(
        identity="run-step-2-checkpoint",
        of="run-step-2",
        step=2,
        weights=str(workdir.weights("run-step-2")),
    )
    remember(state, "run-step-3", 3, SnapshotKind.INCREMENTAL, workdir.weights("run-step-3"))
    return state


def test_a_checkpoint_on_its_way_keeps_its_weights_and_its_encoded_full(tmp_path: Path) -> None:
    workdir = WorkDir(tmp_path)
    state = _checkpointed_state(workdir)
    assert state.last is not None and state.last.last_full_step == 2  # the cadence restarts
    tidy(workdir, state)
    assert workdir.weights("run-step-2").is_dir()  # pinned for the lane
    assert workdir.encoded("run-step-2-checkpoint").is_dir()
    assert not workdir.weights("run-step-1").exists()
    assert WorkDir(tmp_path).load("demo", "ns").checkpoint_pending == state.checkpoint_pending

    state.checkpoint, state.checkpoint_pending = state.checkpoint_pending, None
    tidy(workdir, state)
    assert not workdir.weights("run-step-2").exists()
    assert not workdir.encoded("run-step-2-checkpoint").exists()


def test_the_named_checkpoint_is_the_complete_one_of_the_current_chain(tmp_path: Path) -> None:
    workdir = WorkDir(tmp_path)
    state = _checkpointed_state(workdir)
    assert state.named_checkpoint() is None  # on its way: not named yet
    state.checkpoint, state.checkpoint_pending = state.checkpoint_pending, None
    assert state.named_checkpoint() == state.checkpoint
    # A Full restarts the chain: the checkpoint of the old one is forgotten.
    remember(state, "run-step-4-full", 4, SnapshotKind.FULL, workdir.weights("run-step-4-full"))
    assert state.checkpoint is None and state.named_checkpoint() is None


def test_a_pending_checkpoint_whose_weights_are_gone_is_dropped_on_load(tmp_path: Path) -> None:
    workdir = WorkDir(tmp_path)
    state = _checkpointed_state(workdir)
    workdir.save(state)
    workdir.weights("run-step-2").rmdir()
    loaded = WorkDir(tmp_path).load("demo", "ns")
    assert loaded.checkpoint_pending is None and loaded.chain == state.chain
