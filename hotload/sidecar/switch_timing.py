"""The sidecar's side of a coordinated switch, as pure rules (docs/operator.md,
"Coordinated switch"; the publisher decides, the operator copies, this module only reads
the target the operator wrote).

- :func:`coordinates` — whether the swap to the target waits for a switch time: the
  deployment says ``spec.rollout.switch: Coordinated``, the target is not what the engine
  serves, and the engine serves something verified (a replica that serves nothing — a new
  pod, an engine that lost its weights — has no policy to stay on, and loads at once).
- :func:`switch_time_of` — the instant to swap at: ``switchAt`` (committed, or the deadline
  the operator presumed), else ``switchBy`` (``onStagingTimeout: Follow``: the deadline,
  which replicas keep even when neither the publisher nor the operator is heard from
  again); None: keep waiting, staged (an Abort takes the target back instead).
- :func:`due` — whether the swap starts now: an engine that stages is handed the instant
  ``STAGED_AHEAD_S`` before it (it waits and swaps between two tokens on the instant);
  another engine is loaded at the instant.
- :func:`switched` — OnTime, or Late when the swap was started after the instant (staged,
  or told the time, only after it).
- :func:`switch_phase` — what the pod says of it (``hotload.dev/switch``), from the job
  runner's note and what the engine serves.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from hotload.api import SnapshotRef
from hotload.api.kinds import Identity
from hotload.api.rollout_deployment import RolloutDeployment
from hotload.api.switch import SwitchMode, SwitchPhase
from hotload.sidecar.planning import Serving, same_snapshot

STAGED_AHEAD_S: Final = 1.0
"""An engine that stages is handed the instant this long before it: the request's way to
the engine (a loaded machine's scheduling included) must fit in it. A sidecar killed in
this window leaves its buffer handed, and its restart settles the load at once (up to this
much early)."""
POLL_S: Final = 0.2
"""While no switch time is known, the target is read again this often (no I/O)."""


def coordinates(
    deployment: RolloutDeployment | None, target: SnapshotRef | None, serving: Serving | None
) -> bool:
    """Whether bringing ``target`` waits for a coordinated switch time."""
    return (
        deployment is not None
        and deployment.spec.rollout.switch is SwitchMode.COORDINATED
        and target is not None
        and serving is not None
        and not same_snapshot(serving, target)
    )


def switch_time_of(target: SnapshotRef | None) -> datetime | None:
    """The instant every replica swaps to ``target`` (None: not decided yet)."""
    if target is None:
        return None
    return target.switch_at or target.switch_by


def due(at: datetime | None, now: datetime, *, stages: bool) -> bool:
    """Whether the swap starts at ``now`` (see the module docstring)."""
    if at is None:
        return False
    ahead = timedelta(seconds=STAGED_AHEAD_S if stages else 0.0)
    return now >= at - ahead


def wait_s(at: datetime | None, now: datetime, *, stages: bool) -> float:
    """How long to wait before looking at the target again (at most :data:`POLL_S`: a commit
    may bring the instant forward from the deadline)."""
    if at is None:
        return POLL_S
    ahead = timedelta(seconds=STAGED_AHEAD_S if stages else 0.0)
    return max(0.0, min(POLL_S, (at - ahead - now).total_seconds()))


def switched(at: datetime, started: datetime) -> SwitchPhase:
    """OnTime when the swap was started by the instant, else Late."""
    return SwitchPhase.LATE if started > at else SwitchPhase.ON_TIME


def switch_phase(
    note: tuple[Identity, SwitchPhase] | None, target: SnapshotRef | None, serving: Serving | None
) -> SwitchPhase | None:
    """``hotload.dev/switch``: Staged while the target waits staged for its switch time,
    OnTime or Late once the engine serves it after a coordinated switch. ``note`` is the
    job runner's word for a target (:attr:`~hotload.sidecar.jobs.JobRunner.switch_note`);
    a note of another target says nothing, nor does Staged once the target is served (the
    engine's word wins) or OnTime/Late while it is not."""
    if note is None or target is None or note[0] != target.identity:
        return None
    serves_target = serving is not None and same_snapshot(serving, target)
    if note[1] is SwitchPhase.STAGED:
        return None if serves_target else SwitchPhase.STAGED
    return note[1] if serves_target else None
