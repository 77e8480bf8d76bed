"""Status conditions shaped like Kubernetes' own (``metav1.Condition``).

Conditions are computed in one function per resource from the whole observed state;
:func:`set_condition` keeps ``lastTransitionTime`` stable when only the message changes,
so a status write happens only when something a user cares about changed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Final

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


def find_condition(conditions: list[Condition], condition_type: str) -> Condition | None:
    return next((c for c in conditions if c.type == condition_type), None)


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
    """Return ``conditions`` with one condition set; the transition time moves only on change."""
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    previous = find_condition(conditions, condition_type)
    moment = now or utc_now()
    if previous is not None and previous.status == status:
        moment = previous.last_transition_time
    updated = Condition(
        type=condition_type,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=moment,
        observed_generation=observed_generation,
    )
    others = [c for c in conditions if c.type != condition_type]
    return sorted([*others, updated], key=lambda c: c.type)
