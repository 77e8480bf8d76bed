"""What the agent writes on its own Pod, computed purely from its state.

Two writes, each only when its content changed (CONTRACTS.md, "What the sidecar writes
on its Pod"):

- the ``hotload.dev/*`` annotations, all of them in one merge patch per transition
  (``reason``/``message`` say why the replica is not at its target: Failed, or Loading
  while it retries a transient failure — a storage outage, say; they are removed, by
  ``null``, once it is Ready);
- the pod condition ``hotload.dev/SnapshotReady`` on ``pods/status``, as a
  strategic-merge patch naming only that condition type, so the other writer's
  conditions (the pod runtime's ``Ready``, ``ContainersReady``, ...) are merged by
  ``type`` and never replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from hotload.api import KvCachePolicy, LoadPath, ReplicaState, SnapshotRef, reasons
from hotload.api.conditions import rfc3339
from hotload.api.kinds import Identity
from hotload.api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_FAILED_SNAPSHOT,
    ANNOTATION_MESSAGE,
    ANNOTATION_REASON,
    ANNOTATION_SINCE,
    ANNOTATION_SNAPSHOT,
    ANNOTATION_STATE,
    ANNOTATION_SWITCH,
    ANNOTATION_TARGET,
    ANNOTATION_VIA,
    CONDITION_SNAPSHOT_READY,
)
from hotload.api.switch import SwitchPhase
from hotload.sidecar.planning import Hold, Serving, replica_state
from hotload.sidecar.status import ErrorRecord

#: Annotation values stay short: the message is for a human glancing at ``kubectl``.
MESSAGE_LIMIT = 1024
#: The gate's message while True: the same for every snapshot (see :func:`readiness_gate`).
VERIFIED_MESSAGE = "serves a verified snapshot (named by hotload.dev/snapshot)"


@dataclass(frozen=True)
class PodAnnotations:
    """The sidecar's annotations: where this replica stands against the target."""

    served_identity: Identity | None
    target_identity: Identity | None
    state: ReplicaState | None
    since: datetime
    via: LoadPath | None = None
    reason: str | None = None
    message: str | None = None
    failed_identity: Identity | None = None
    """While Failed: the snapshot whose files failed (may be an earlier link of a replay)."""
    switch: SwitchPhase | None = None
    """A coordinated switch: Staged (Loading), OnTime or Late (Ready)."""
    digest: str | None = None
    """The weights digest verified of what the engine serves (None: the engine gives none)."""

    def values(self) -> dict[str, str | None]:
        """Annotation key → value; None removes the key (merge-patch semantics)."""
        return dict(self._values)

    @cached_property
    def _values(self) -> dict[str, str | None]:
        """Computed once: an agent compares its report with its pod on every pass."""
        failed = self.state is ReplicaState.FAILED
        why = failed or (self.state is ReplicaState.LOADING and self.reason is not None)
        message = self.message[:MESSAGE_LIMIT] if why and self.message else None
        return {
            ANNOTATION_SNAPSHOT: self.served_identity,
            ANNOTATION_DIGEST: self.digest if self.served_identity else None,
            ANNOTATION_TARGET: self.target_identity,
            ANNOTATION_STATE: self.state.value if self.state else None,
            ANNOTATION_SINCE: rfc3339(self.since),
            ANNOTATION_VIA: self.via.value if self.via else None,
            ANNOTATION_REASON: self.reason if why else None,
            ANNOTATION_MESSAGE: message,
            ANNOTATION_FAILED_SNAPSHOT: self.failed_identity if failed else None,
            ANNOTATION_SWITCH: self.switch.value if self.switch else None,
        }

    def same_content(self, other: PodAnnotations | None) -> bool:
        """Equal but for ``since`` (a rewrite with only a new time is no transition)."""
        if other is None:
            return False
        mine, theirs = self.values(), other.values()
        mine.pop(ANNOTATION_SINCE)
        theirs.pop(ANNOTATION_SINCE)
        return mine == theirs


def annotation_patch(annotations: PodAnnotations) -> dict[str, Any]:
    """The merge patch of ``metadata.annotations`` for one transition."""
    return {"metadata": {"annotations": annotations.values()}}


@dataclass(frozen=True)
class ReadinessGate:
    """The ``hotload.dev/SnapshotReady`` condition: "this pod serves a verified snapshot"."""

    ready: bool
    reason: str
    message: str


def readiness_gate(
    served_step: int | None,
    served_identity: Identity | None,
    target_step: int | None,
    max_stale_steps: int | None,
) -> ReadinessGate:
    """True from the first verified load on; False before it, or when too stale.

    It stays True while a newer snapshot downloads or after a failed delta (the pod keeps
    serving its last good one). Being at the target is the ``state`` annotation's job.

    While True its message does not name the snapshot (the ``snapshot`` annotation does):
    the condition then stays the same across a delta, and a rollout costs each replica
    its annotation patches only, not a ``pods/status`` write as well — at 1,000 replicas a
    third fewer writes for the API server and every pod watcher to process.
    """
    if served_step is None or served_identity is None:
        return ReadinessGate(False, reasons.NOT_LOADED, "no verified snapshot loaded yet")
    if max_stale_steps is not None and target_step is not None:
        behind = target_step - served_step
        if behind > max_stale_steps:
            return ReadinessGate(
                False,
                reasons.STALE,
                f"serves {served_identity}, {behind} steps behind the target"
                f" (maxStaleSteps {max_stale_steps})",
            )
    return ReadinessGate(True, reasons.VERIFIED, VERIFIED_MESSAGE)


def condition_patch(gate: ReadinessGate, last_transition: datetime) -> dict[str, Any]:
    """The strategic-merge patch of ``pods/status`` carrying only our condition type."""
    return {
        "status": {
            "conditions": [
                {
                    "type": CONDITION_SNAPSHOT_READY,
                    "status": "True" if gate.ready else "False",
                    "reason": gate.reason,
                    "message": gate.message,
                    "lastTransitionTime": rfc3339(last_transition),
                    "lastProbeTime": None,
                }
            ]
        }
    }


@dataclass(frozen=True)
class ReplicaReport:
    """Everything the pod says about itself at one moment (``/status`` shows the same)."""

    state: ReplicaState | None
    since: datetime
    """When ``state`` last changed."""
    current: SnapshotRef | None
    """What it serves, as the deployment's status would name it."""
    via: LoadPath | None
    reason: str | None
    message: str | None
    annotations: PodAnnotations
    gate: ReadinessGate


def replica_report(
    target: SnapshotRef | None,
    serving: Serving | None,
    hold: Hold | None,
    *,
    previous: tuple[ReplicaState | None, datetime],
    last_error: ErrorRecord | None = None,
    now: datetime,
    max_stale_steps: int | None,
    switch: SwitchPhase | None = None,
) -> ReplicaReport:
    """The pod's report from what the agent knows (``previous``: the last state and since;
    ``last_error``: the agent's last failure, which a Loading pod names while it retries
    that failure of its target — why it is not there yet, for ``hotload ledger``)."""
    state = replica_state(target, serving, hold)
    since = now if previous[0] is not state else previous[1]
    failed = state is ReplicaState.FAILED and hold is not None
    reason = hold.reason if failed and hold else None
    message = hold.message if failed and hold else None
    retrying = (
        last_error
        if state is ReplicaState.LOADING
        and target is not None
        and last_error is not None
        and last_error.transient
        and last_error.target == target.identity
        else None
    )
    current = (
        SnapshotRef(
            identity=serving.identity,
            step=serving.step,
            kind=serving.kind,
            kv_cache_policy=target.kv_cache_policy if target else KvCachePolicy.ALL,
        )
        if serving is not None
        else None
    )
    annotations = PodAnnotations(
        served_identity=serving.identity if serving else None,
        target_identity=target.identity if target else None,
        state=state,
        since=since,
        via=serving.via if serving else None,
        reason=reason or (retrying.reason if retrying else None),
        message=message or (retrying.message if retrying else None),
        failed_identity=hold.failed_identity if failed and hold else None,
        switch=switch if state is not ReplicaState.FAILED else None,
        digest=serving.digest if serving and serving.digest_confirmed else None,
    )
    gate = readiness_gate(
        serving.step if serving else None,
        serving.identity if serving else None,
        target.step if target else None,
        max_stale_steps,
    )
    via = serving.via if serving else None
    return ReplicaReport(state, since, current, via, reason, message, annotations, gate)
