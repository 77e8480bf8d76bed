from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hotload.api import ConditionStatus, set_condition
from hotload.api.conditions import find_condition, rfc3339

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


def test_transition_time_moves_only_when_status_changes() -> None:
    conditions = set_condition([], "Ready", False, "Rolling", "0/3", now=T0)
    later = T0 + timedelta(minutes=1)
    conditions = set_condition(conditions, "Ready", False, "Rolling", "1/3", now=later)
    ready = find_condition(conditions, "Ready")
    assert ready is not None and ready.last_transition_time == T0 and ready.message == "1/3"
    conditions = set_condition(conditions, "Ready", True, "Rolled", "3/3", now=later)
    ready = find_condition(conditions, "Ready")
    assert ready is not None and ready.status is ConditionStatus.TRUE
    assert ready.last_transition_time == later


def test_conditions_stay_sorted_and_unique_by_type() -> None:
    conditions = set_condition([], "Ready", True, "Rolled", now=T0)
    conditions = set_condition(conditions, "ChainValid", True, "Verified", now=T0)
    conditions = set_condition(conditions, "Ready", False, "Rolling", now=T0)
    assert [c.type for c in conditions] == ["ChainValid", "Ready"]


def test_rfc3339_is_utc_with_a_z() -> None:
    assert rfc3339(T0 + timedelta(microseconds=5)) == "2026-11-23T09:00:00Z"


def test_set_condition_and_the_operator_s_merge_are_one_rule() -> None:
    from hotload.api.conditions import DesiredCondition, merge_conditions

    later = T0.replace(minute=T0.minute + 1)
    typed = set_condition([], "Ready", False, "Rolling", "0/3", now=T0)
    typed = set_condition(typed, "Ready", False, "Rolling", "1/3", now=later)
    wire = merge_conditions(
        [c.to_k8s() for c in set_condition([], "Ready", False, "Rolling", "0/3", now=T0)],
        [DesiredCondition("Ready", ConditionStatus.FALSE, "Rolling", "1/3")],
        observed_generation=None,
        now=later,
    )
    assert [c.to_k8s() for c in typed] == wire
