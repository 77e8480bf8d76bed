"""The coordinated switch as the operator plans it: pure functions, no API calls.

The publisher decides (docs/operator.md, "Coordinated switch"); the operator only turns
what it finds on a PolicySnapshot into the target's ``switchAt`` and the snapshot's
``status.switch``, and applies the one rule every replica shares when no decision reaches
it: at the deadline (``hotload.dev/switch-by``), ``onStagingTimeout`` is presumed —
Follow switches at the deadline, Abort gives the switch up. A decision the publisher
wrote always wins over a presumption, even one written after the deadline (it reached
this region late); a commit wins over an abort (some region may have switched on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from hotload.api.labels import (
    SWITCH_ABORTED_ANNOTATION,
    SWITCH_AT_ANNOTATION,
    SWITCH_BY_ANNOTATION,
)
from hotload.api.rollout_deployment import RolloutSpec
from hotload.api.switch import (
    StagingTimeoutAction,
    SwitchDecision,
    SwitchMode,
    parse_switch_time,
)


@dataclass(frozen=True)
class SwitchFacts:
    """What the publisher wrote on one PolicySnapshot (its metadata, each written once)."""

    committed_at: datetime | None = None
    """``hotload.dev/switch-at``: the committed switch time."""
    aborted_at: datetime | None = None
    """``hotload.dev/switch-aborted``: when the publisher gave the switch up."""
    deadline: datetime | None = None
    """``hotload.dev/switch-by``: the deadline after which replicas presume."""


def switch_facts(annotations: Mapping[str, object]) -> SwitchFacts:
    """The switch annotations of a PolicySnapshot; a malformed one is no decision."""
    return SwitchFacts(
        committed_at=parse_switch_time(annotations.get(SWITCH_AT_ANNOTATION)),
        aborted_at=parse_switch_time(annotations.get(SWITCH_ABORTED_ANNOTATION)),
        deadline=parse_switch_time(annotations.get(SWITCH_BY_ANNOTATION)),
    )


@dataclass(frozen=True)
class SwitchPlan:
    """One snapshot's coordinated switch, as it stands now."""

    decision: SwitchDecision
    at: datetime | None
    """The switch time (Committed, Presumed)."""
    deadline: datetime
    """When replicas presume ``onStagingTimeout`` if nothing was decided."""
    follows: bool
    """``onStagingTimeout`` is Follow: replicas switch at the deadline on their own."""

    @property
    def aborted(self) -> bool:
        return self.decision is SwitchDecision.ABORTED

    @property
    def wake_at(self) -> datetime | None:
        """When the operator must look again on its own (the deadline, while undecided)."""
        return self.deadline if self.decision is SwitchDecision.STAGING else None

    @property
    def target_switch_at(self) -> datetime | None:
        """``status.targetSnapshot.switchAt``."""
        return self.at

    @property
    def target_switch_by(self) -> datetime | None:
        """``status.targetSnapshot.switchBy``: only while undecided and replicas would switch
        at the deadline on their own (Follow), so that they do even without the operator."""
        return self.deadline if self.decision is SwitchDecision.STAGING and self.follows else None


def switch_deadline(facts: SwitchFacts, created: datetime | None, rollout: RolloutSpec,
                    now: datetime) -> datetime:  # fmt: skip
    """The publisher's deadline, else (a snapshot applied by hand) its creation plus the
    staging timeout and the lead: the same rule in every region for the same object."""
    if facts.deadline is not None:
        return facts.deadline
    start = created or now
    return start + timedelta(
        seconds=rollout.staging_timeout_seconds, milliseconds=rollout.lead_milliseconds
    )


def plan_switch(
    facts: SwitchFacts, created: datetime | None, rollout: RolloutSpec, now: datetime
) -> SwitchPlan | None:
    """The switch of one snapshot of a deployment with ``rollout``; None when Independent."""
    if rollout.switch is not SwitchMode.COORDINATED:
        return None
    deadline = switch_deadline(facts, created, rollout, now)
    follows = rollout.on_staging_timeout is StagingTimeoutAction.FOLLOW
    if facts.committed_at is not None:
        return SwitchPlan(SwitchDecision.COMMITTED, facts.committed_at, deadline, follows)
    if facts.aborted_at is not None:
        return SwitchPlan(SwitchDecision.ABORTED, None, deadline, follows)
    if now >= deadline:
        if follows:
            return SwitchPlan(SwitchDecision.PRESUMED, deadline, deadline, follows)
        return SwitchPlan(SwitchDecision.ABORTED, None, deadline, follows)
    return SwitchPlan(SwitchDecision.STAGING, None, deadline, follows)
