"""The sidecar's coordinated-switch rules, as a table: when a swap waits, for what instant,
when it starts, and how the pod says it went (hotload/sidecar/switch_timing.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from hotload.api import (
    KvCachePolicy,
    LoadPath,
    ReplicaState,
    RolloutDeployment,
    SnapshotKind,
    SnapshotRef,
)
from hotload.api.pod import ANNOTATION_STATE, ANNOTATION_SWITCH, SIDECAR_ANNOTATIONS
from hotload.api.switch import SwitchPhase
from hotload.sidecar.planning import Serving, Slot
from hotload.sidecar.pod_report import annotation_patch, replica_report
from hotload.sidecar.switch_timing import (
    STAGED_AHEAD_S,
    coordinates,
    due,
    switch_phase,
    switch_time_of,
    switched,
    wait_s,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NOW = datetime(2026, 11, 23, 9, 45, 12, 345000, tzinfo=UTC)


def _deployment(switch: str) -> RolloutDeployment:
    document: dict[str, Any] = yaml.safe_load((EXAMPLES / "rolloutdeployment.yaml").read_text())
    document["spec"]["rollout"] = {"switch": switch}
    return RolloutDeployment.model_validate(document)


def _target(identity: str = "s-2", step: int = 2, **switch: datetime) -> SnapshotRef:
    return SnapshotRef(identity=identity, step=step, kind=SnapshotKind.INCREMENTAL,
                       kv_cache_policy=KvCachePolicy.ALL, **switch)  # fmt: skip


def _serving(identity: str = "s-1", step: int = 1) -> Serving:
    return Serving(identity, step, SnapshotKind.INCREMENTAL, LoadPath.DELTA, Slot.A, "i-1")


@pytest.mark.parametrize(
    ("switch", "target", "serving", "waits"),
    [
        ("Coordinated", _target(), _serving(), True),
        # Independent is today's behaviour: never waits.
        ("Independent", _target(), _serving(), False),
        # Nothing verified served (a new pod, an engine that lost its weights): no policy
        # to stay on, so it loads at once.
        ("Coordinated", _target(), None, False),
        # Already serving the target (a catch-up, a reload): nothing to switch.
        ("Coordinated", _target("s-1", 1), _serving(), False),
        ("Coordinated", None, _serving(), False),
    ],
)
def test_which_swaps_wait_for_a_switch_time(
    switch: str, target: SnapshotRef | None, serving: Serving | None, waits: bool
) -> None:
    assert coordinates(_deployment(switch), target, serving) is waits


def test_the_instant_is_the_commit_else_the_deadline_else_none() -> None:
    at, by = NOW + timedelta(seconds=2), NOW + timedelta(seconds=30)
    assert switch_time_of(_target(switch_at=at, switch_by=by)) == at
    assert switch_time_of(_target(switch_by=by)) == by  # publisher gone, Follow
    assert switch_time_of(_target()) is None  # undecided (or Abort): wait staged
    assert switch_time_of(None) is None


def test_an_engine_that_stages_is_handed_the_instant_ahead_and_others_load_on_it() -> None:
    at = NOW + timedelta(seconds=5)
    ahead = at - timedelta(seconds=STAGED_AHEAD_S)
    assert not due(None, NOW, stages=True) and not due(None, NOW, stages=False)
    assert not due(at, ahead - timedelta(milliseconds=1), stages=True)
    assert due(at, ahead, stages=True)
    assert not due(at, at - timedelta(milliseconds=1), stages=False)
    assert due(at, at, stages=False)
    # Waits are short (a commit may bring the instant forward), never negative.
    assert 0 < wait_s(None, NOW, stages=False) <= 0.2
    assert wait_s(at, at + timedelta(seconds=1), stages=False) == 0.0
    assert wait_s(at, at - timedelta(milliseconds=50), stages=False) == pytest.approx(0.05)


def test_a_swap_started_after_the_instant_is_late() -> None:
    assert switched(NOW, NOW) is SwitchPhase.ON_TIME
    assert switched(NOW, NOW - timedelta(seconds=1)) is SwitchPhase.ON_TIME
    assert switched(NOW, NOW + timedelta(milliseconds=1)) is SwitchPhase.LATE


STAGED, ON_TIME, LATE = SwitchPhase.STAGED, SwitchPhase.ON_TIME, SwitchPhase.LATE


@pytest.mark.parametrize(
    ("note", "target", "serving", "says"),
    [
        # Staged while the engine still serves the older snapshot.
        (("s-2", STAGED), _target(), _serving(), STAGED),
        # Staged, but the engine serves the target already (its own word wins): nothing.
        (("s-2", STAGED), _target(), _serving("s-2", 2), None),
        # Swapped: OnTime or Late once the engine serves the target, not before.
        (("s-2", ON_TIME), _target(), _serving("s-2", 2), ON_TIME),
        (("s-2", LATE), _target(), _serving("s-2", 2), LATE),
        (("s-2", LATE), _target(), _serving(), None),
        (("s-2", ON_TIME), _target(), None, None),
        # A note of another target, no note, or no target: nothing to say.
        (("s-1", STAGED), _target(), _serving(), None),
        (None, _target(), _serving(), None),
        (("s-2", STAGED), None, _serving(), None),
    ],
)
def test_the_switch_annotation_follows_the_runners_note_and_what_the_engine_serves(
    note: tuple[str, SwitchPhase] | None,
    target: SnapshotRef | None,
    serving: Serving | None,
    says: SwitchPhase | None,
) -> None:
    """Would catch a Staged left on a replica that serves the target, an OnTime said before
    the engine serves it, or a note of an older target carried onto a newer one."""
    assert switch_phase(note, target, serving) is says


def test_the_pod_says_staged_while_loading_and_on_time_once_ready_in_the_same_patch() -> None:
    """Would catch the switch annotation left out of the one report patch (the operator
    would never count the replica Staged), or left on a Failed replica."""
    assert ANNOTATION_SWITCH in SIDECAR_ANNOTATIONS
    staged = replica_report(_target(), _serving(), None, previous=(None, NOW), now=NOW,
                            max_stale_steps=None, switch=SwitchPhase.STAGED)  # fmt: skip
    notes = annotation_patch(staged.annotations)["metadata"]["annotations"]
    assert (notes[ANNOTATION_STATE], notes[ANNOTATION_SWITCH]) == ("Loading", "Staged")
    done = replica_report(_target(), _serving("s-2", 2), None, previous=(None, NOW), now=NOW,
                          max_stale_steps=None, switch=SwitchPhase.ON_TIME)  # fmt: skip
    assert done.state is ReplicaState.READY
    assert annotation_patch(done.annotations)["metadata"]["annotations"][ANNOTATION_SWITCH] == (
        "OnTime"
    )
    plain = replica_report(_target(), _serving(), None, previous=(None, NOW), now=NOW,
                           max_stale_steps=None)  # fmt: skip
    assert annotation_patch(plain.annotations)["metadata"]["annotations"][ANNOTATION_SWITCH] is None
