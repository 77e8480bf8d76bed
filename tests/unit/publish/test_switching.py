"""The publisher's coordinated switch decision: pure rules over what the regions say."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hotload.api.labels import SWITCH_ABORTED_ANNOTATION, SWITCH_AT_ANNOTATION
from hotload.api.rollout_deployment import RolloutSpec
from hotload.api.switch import StagingTimeoutAction, SwitchMode, switch_time
from hotload.publish.region_client import SnapshotState
from hotload.publish.switching import FleetSwitch, SwitchCoordinator, decide, fleet_switch

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
FOLLOW = FleetSwitch(contexts=("a", "b"), timeout_s=60, lead_s=2, abort=False)
ABORT = FleetSwitch(contexts=("a", "b"), timeout_s=60, lead_s=2, abort=True)
DEADLINE = NOW + timedelta(seconds=62)


def look(staged: int | None, desired: int | None = 2, **kw: object) -> SnapshotState:
    return SnapshotState(exists=True, staged_replicas=staged, desired_replicas=desired, **kw)  # type: ignore[arg-type]


def test_only_coordinated_regions_count_and_the_strictest_settings_win() -> None:
    independent = RolloutSpec()
    coordinated = RolloutSpec(switch=SwitchMode.COORDINATED, staging_timeout_seconds=30)
    assert fleet_switch({"a": independent}) is None
    aborting = coordinated.model_copy(
        update={"on_staging_timeout": StagingTimeoutAction.ABORT, "lead_milliseconds": 500,
                "staging_timeout_seconds": 90}
    )  # fmt: skip
    fleet = fleet_switch({"a": coordinated, "b": aborting, "c": independent})
    assert fleet == FleetSwitch(contexts=("a", "b"), timeout_s=90, lead_s=2.0, abort=True)


def test_a_region_that_does_not_answer_counts_among_the_coordinated_ones() -> None:
    """Not Staged until it answers, and handed the decision: never decided without it."""
    coordinated = RolloutSpec(switch=SwitchMode.COORDINATED, staging_timeout_seconds=30)
    fleet = fleet_switch({"a": coordinated, "c": coordinated}, silent=["b"])
    assert fleet is not None and fleet.contexts == ("a", "b", "c")
    # Alone it makes no fleet: nothing says the deployment coordinates at all.
    assert fleet_switch({"a": RolloutSpec()}, silent=["b"]) is None
    assert fleet_switch({}, silent=["b"]) is None


@pytest.mark.parametrize(
    ("looks", "fleet", "now", "expected"),
    [
        # Everyone Staged: commit now + lead.
        ({"a": look(2), "b": look(2)}, FOLLOW, NOW,
         (SWITCH_AT_ANNOTATION, switch_time(NOW + timedelta(seconds=2)), True)),
        # Counting replicas that serve it already (stagedReplicas includes them).
        ({"a": look(3, 3), "b": look(0, 0)}, ABORT, NOW,
         (SWITCH_AT_ANNOTATION, switch_time(NOW + timedelta(seconds=2)), True)),
        # Not yet: keep waiting (a region not answering, or not applied yet, is not Staged).
        ({"a": look(2), "b": look(1)}, FOLLOW, NOW, None),
        ({"a": look(2), "b": SnapshotState(exists=False)}, FOLLOW, NOW, None),
        ({"a": look(2), "b": look(None, None)}, FOLLOW, NOW, None),
        # At the staging timeout (deadline - lead): Follow commits at the deadline, the
        # moment every region presumes anyway; Abort aborts.
        ({"a": look(2), "b": look(1)}, FOLLOW, DEADLINE - timedelta(seconds=2),
         (SWITCH_AT_ANNOTATION, switch_time(DEADLINE), False)),
        ({"a": look(2), "b": look(1)}, ABORT, DEADLINE - timedelta(seconds=2),
         (SWITCH_ABORTED_ANNOTATION, switch_time(DEADLINE - timedelta(seconds=2)), False)),
        # A late look never commits past the deadline.
        ({"a": look(2), "b": look(2)}, FOLLOW, DEADLINE - timedelta(seconds=1),
         (SWITCH_AT_ANNOTATION, switch_time(DEADLINE), True)),
        # A decision already written (a publisher that restarted) is adopted; a commit
        # anywhere wins over an abort elsewhere.
        ({"a": look(1, decided=(SWITCH_ABORTED_ANNOTATION, "x")),
          "b": look(1, decided=(SWITCH_AT_ANNOTATION, "y"))}, ABORT, NOW,
         (SWITCH_AT_ANNOTATION, "y", False)),
    ],
)  # fmt: skip
def test_decisions(
    looks: dict[str, SnapshotState],
    fleet: FleetSwitch,
    now: datetime,
    expected: tuple[str, str, bool] | None,
) -> None:
    decision = decide(looks, fleet, now, DEADLINE)
    got = None if decision is None else (decision.annotation, decision.value, decision.all_staged)
    assert got == expected


def test_the_deadline_is_stamped_on_the_snapshot_every_region_gets() -> None:
    policy: dict[str, object] = {"metadata": {"name": "p-step-1"}}
    deadline = SwitchCoordinator.stamp(policy, FOLLOW, NOW)
    assert deadline == DEADLINE
    assert policy["metadata"] == {
        "name": "p-step-1",
        "annotations": {"hotload.dev/switch-by": "2026-11-23T10:01:02.000Z"},
    }
