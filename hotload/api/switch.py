"""The coordinated switch's vocabulary (docs/operator.md, "Coordinated switch").

With ``spec.rollout.switch: Coordinated`` every replica of every region stages the target
(fetched, verified, rebuilt, the engine ready to load it) and reports ``Staged``; the
publisher, which sees every region, then commits one switch time on each region's
PolicySnapshot (the annotation ``hotload.dev/switch-at``); the operator copies it into
``status.targetSnapshot.switchAt``; each sidecar swaps at that moment. Plain names here,
no pydantic: the operator's planner, the sidecar and the publisher share them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from hotload.api.conditions import parse_time


class SwitchMode(StrEnum):
    """``spec.rollout.switch``: when a replica swaps to a new target."""

    INDEPENDENT = "Independent"
    """As soon as it is ready (each replica on its own; the default)."""
    COORDINATED = "Coordinated"
    """Every replica of every region at one committed moment."""


class StagingTimeoutAction(StrEnum):
    """``spec.rollout.onStagingTimeout``: what the switch does with replicas that are not
    Staged when ``stagingTimeoutSeconds`` has passed (and what replicas presume when no
    decision reaches them by then)."""

    FOLLOW = "Follow"
    """Switch those Staged; the others follow as soon as they are (``Late`` in the ledger)."""
    ABORT = "Abort"
    """Nobody switches: the target goes back to what the fleet serves."""


class SwitchPhase(StrEnum):
    """A replica's place in a coordinated switch: the pod annotation ``hotload.dev/switch``
    and the ledger's ``phase`` (the ``state`` stays Loading | Ready | Failed)."""

    STAGED = "Staged"
    """Its target is staged and the engine ready to load it; it waits for the switch time
    (state ``Loading``)."""
    ON_TIME = "OnTime"
    """It swapped at the committed switch time (state ``Ready``)."""
    LATE = "Late"
    """It swapped after the switch time: staged only after it, or told of it only after it
    (state ``Ready``)."""


def switch_time(moment: datetime) -> str:
    """A switch time as written everywhere: RFC 3339, UTC, milliseconds
    (``2026-11-23T09:45:00.250Z``)."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_switch_time(value: object) -> datetime | None:
    """A switch time written by :func:`switch_time` (any RFC 3339 is read; one without a
    zone is UTC); None for anything else: a malformed annotation is no decision."""
    return parse_time(value)


class SwitchDecision(StrEnum):
    """Where a coordinated switch of one snapshot stands (its ``status.switch.decision``)."""

    STAGING = "Staging"
    """No decision yet: replicas stage and wait."""
    COMMITTED = "Committed"
    """The publisher committed a switch time (``hotload.dev/switch-at``)."""
    PRESUMED = "Presumed"
    """No decision came by the deadline (``hotload.dev/switch-by``) and onStagingTimeout is
    Follow: every replica switches at the deadline."""
    ABORTED = "Aborted"
    """The publisher aborted (``hotload.dev/switch-aborted``), or no decision came by the
    deadline and onStagingTimeout is Abort: nobody switches to this snapshot."""
