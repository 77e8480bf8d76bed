"""Status conditions shaped like Kubernetes' own (``metav1.Condition``), and the one rule
that records them.

Conditions are computed in one function per resource from the whole observed state (the
operator's ``snapshot_status`` and ``deployment_status``) as :class:`DesiredCondition`
values; :func:`merge_conditions` turns those into the stored list, keeping
``lastTransitionTime`` when the status did not change, so a reconcile that finds nothing
new produces an identical list (and no write). :func:`set_condition` is the same rule for
one condition of a typed list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import Field

from hotload.api._base import ApiStatusModel

# Condition types.
READY: Final = "Ready"
CHAIN_VALID: Final = "ChainValid"
AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
SNAPSHOT_READY: Final = "SnapshotReady"
DEGRADED: Final = "Degraded"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def utc_now() -> datetime:
    """Now, in UTC, to the second (Kubernetes timestamps carry no fraction)."""
    return datetime.now(UTC).replace(microsecond=0)


def rfc3339(moment: datetime) -> str:
    """A timestamp as Kubernetes writes it: ``2026-11-23T09:45:00Z``."""
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 timestamp (``Z`` or an offset, with or without a fraction), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


class Condition(ApiStatusModel):
    """One observation of the object's state, as in Kubernetes' metav1.Condition."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    """Condition type, CamelCase (Ready, ChainValid, Available, Progressing, ...)."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[str, Field(min_length=1, max_length=1024)]
    """One CamelCase word a program can branch on."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """What a human should know, in a sentence."""
    last_transition_time: datetime
    """When status last changed (not reason or message)."""
    observed_generation: Annotated[int | None, Field(ge=0)] = None
    """The .metadata.generation this condition was computed from."""


WireCondition = dict[str, Any]
"""A condition as the API server stores it (camelCase keys)."""


@dataclass(frozen=True)
class DesiredCondition:
    """A condition as a planner computes it: no times, those are the record's business."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def find_condition(conditions: list[Condition], condition_type: str) -> Condition | None:
    return next((c for c in conditions if c.type == condition_type), None)


def find_wire(
    conditions: Sequence[Mapping[str, Any]], condition_type: str
) -> Mapping[str, Any] | None:
    """The stored condition of a type, from a status as the API server returned it."""
    return next((c for c in conditions if c.get("type") == condition_type), None)


def is_true(conditions: Sequence[Mapping[str, Any]], condition_type: str) -> bool:
    found = find_wire(conditions, condition_type)
    return found is not None and found.get("status") == ConditionStatus.TRUE.value


def merge_conditions(
    recorded: Sequence[Mapping[str, Any]],
    desired: Iterable[DesiredCondition],
    *,
    observed_generation: int | None,
    now: datetime,
) -> list[WireCondition]:
    """The stored list for ``desired`` (sorted by type); transition times move only on change."""
    merged: list[WireCondition] = []
    for condition in desired:
        previous = find_wire(recorded, condition.type)
        moment = rfc3339(now)
        if previous is not None and previous.get("status") == condition.status.value:
            moment = previous.get("lastTransitionTime") or moment
        wire: WireCondition = {
            "type": condition.type,
            "status": condition.status.value,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": moment,
        }
        if observed_generation is not None:
            wire["observedGeneration"] = observed_generation
        merged.append(wire)
    return sorted(merged, key=lambda c: str(c["type"]))


def transitions(
    recorded: Sequence[Mapping[str, Any]], merged: Sequence[Mapping[str, Any]]
) -> list[tuple[Mapping[str, Any] | None, Mapping[str, Any]]]:
    """(before, after) for each condition whose status or reason changed."""
    changed = []
    for after in merged:
        before = find_wire(recorded, str(after["type"]))
        if before is None or (before.get("status"), before.get("reason")) != (
            after["status"],
            after["reason"],
        ):
            changed.append((before, after))
    return changed


def set_condition(
    conditions: list[Condition],
    condition_type: str,
    status: ConditionStatus | bool,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return ``conditions`` with one condition set, by :func:`merge_conditions`'s rule."""
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    previous = find_condition(conditions, condition_type)
    (wire,) = merge_conditions(
        [previous.to_k8s()] if previous is not None else [],
        [DesiredCondition(condition_type, status, reason, message)],
        observed_generation=observed_generation,
        now=now or utc_now(),
    )
    updated = Condition.model_validate(wire)
    others = [c for c in conditions if c.type != condition_type]
    return sorted([*others, updated], key=lambda c: c.type)
