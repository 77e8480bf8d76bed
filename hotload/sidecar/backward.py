"""A target another writer moved back: refused before anything is fetched or loaded.

Pure: the loop (:mod:`hotload.sidecar.agent`) asks :func:`refuse_backward` first on every
turn, and folds the failure it returns. The operator moves a deployment's target behind
what replicas serve only when the target broke or was deleted unguarded, and records it in
``status.rollback.toIdentity``; a target behind the served snapshot that the record does
not name was written by someone else (the rule:
:func:`~hotload.sidecar.planning.unconfirmed_backward`). The replica loads nothing older,
lets the job in flight go on, and says Failed/TargetInconsistent until the operator
restores the target, so no engine serves the older weights, not even for the moment the
repair takes (docs/sidecar.md, "A target moved back").
"""

from __future__ import annotations

from dataclasses import dataclass

from hotload.api import RolloutDeployment, SnapshotRef, reasons
from hotload.sidecar.memory import Failed, Memory
from hotload.sidecar.planning import Action, FailureDecision, same_target, unconfirmed_backward


@dataclass(frozen=True)
class Refusal:
    """The target is refused: the loop starts and preempts nothing this turn, and the
    replica says Failed on it."""

    failed: Failed | None
    """The failure to fold the first time the target is refused; None while the replica
    already holds on it (folding it again would count another attempt)."""


def refuse_backward(
    deployment: RolloutDeployment | None, target: SnapshotRef | None, memory: Memory
) -> Refusal | None:
    """Whether ``target`` is refused as a backward move the operator did not make (None:
    follow it)."""
    rollback = deployment.status.rollback if deployment and deployment.status else None
    confirmed = rollback.to_identity if rollback is not None else None
    if target is None or not unconfirmed_backward(target, memory.serving, confirmed):
        return None
    if memory.hold is not None and same_target(memory.hold.target, target):
        return Refusal(None)
    message = (
        f"the target {target.identity} (step {target.step}) is behind the served "
        "snapshot and the operator did not move it back (status.rollback does not "
        "name it): not loaded; waiting for the operator's repair"
    )
    decision = FailureDecision(Action.FAIL, reasons.TARGET_INCONSISTENT)
    return Refusal(Failed(decision, target, message, target.identity))
