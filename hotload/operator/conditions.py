"""Conditions as the API stores them, computed whole and merged with what is recorded.

Each resource's conditions are computed in one function from the whole observed state
(``snapshot_status``, ``deployment_status``); this module only turns those desired
conditions into the stored list, keeping ``lastTransitionTime`` when the status did not
change, so a reconcile that finds nothing new produces an identical list (and no write).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from hotload.api import ConditionStatus
from hotload.api.conditions import rfc3339

WireCondition = dict[str, Any]

# Condition reasons the operator writes beside those of hotload.api.reasons.
PENDING: Final = "Pending"
"""A snapshot that is not (yet) the target."""
CHAIN_INVALID: Final = "ChainInvalid"
"""A snapshot whose chain is broken never turns Ready."""
NO_TARGET: Final = "NoTarget"
ROLLED_OUT: Final = "RolledOut"
REPLICAS_SERVING: Final = "ReplicasServing"
REPLICAS_UNAVAILABLE: Final = "ReplicasUnavailable"
SCALED_TO_ZERO: Final = "ScaledToZero"
REPLICAS_FAILED: Final = "ReplicasFailed"
HEALTHY: Final = "Healthy"


@dataclass(frozen=True)
class DesiredCondition:
    type: str
    status: ConditionStatus
    reason: str
    message: str


def find(conditions: Sequence[Mapping[str, Any]], condition_type: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == condition_type), None)


def is_true(conditions: Sequence[Mapping[str, Any]], condition_type: str) -> bool:
    found = find(conditions, condition_type)
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
        previous = find(recorded, condition.type)
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
        before = find(recorded, str(after["type"]))
        if before is None or (before.get("status"), before.get("reason")) != (
            after["status"],
            after["reason"],
        ):
            changed.append((before, after))
    return changed
