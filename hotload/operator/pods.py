"""What one replica pod says about itself, parsed once per watch event.

The sidecar's annotations and its ``hotload.dev/SnapshotReady`` condition are the only
channel from a replica to the operator (CONTRACTS.md, "What the sidecar writes"). The
operator reads them, never writes pods. A value it cannot parse is treated as unknown,
never as an error: a pod written by a newer or broken sidecar must not stop the
reconciler of the whole deployment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from hotload.api import LoadPath, ReplicaState
from hotload.api import pod as contract
from hotload.api.conditions import parse_time
from hotload.api.kinds import Identity
from hotload.api.labels import INSTANCE_LABEL
from hotload.api.switch import SwitchPhase

#: ``<statefulset>-<ordinal>``: the StatefulSet names each pod after its ordinal.
_ORDINAL: Final = re.compile(r"-(\d+)$")


@dataclass(frozen=True)
class PodReport:
    """One replica as the operator sees it: identity, lifecycle, and the sidecar's report."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    deployment: str
    created: datetime | None
    terminating: bool
    served_identity: Identity | None = None
    """Identity it serves now (verified)."""
    target_identity: Identity | None = None
    """Identity it is working on."""
    state: ReplicaState | None = None
    since: datetime | None = None
    via: str | None = None
    reason: str | None = None
    message: str | None = None
    failed_identity: Identity | None = None
    """While Failed: the snapshot whose files failed (may be an earlier link than the target)."""
    serves_verified: bool = False
    """The readiness gate ``hotload.dev/SnapshotReady`` is True."""
    switch_phase: SwitchPhase | None = None
    """Coordinated switch: Staged (its target, waiting for the switch time), OnTime, Late."""
    digest: str | None = None
    """The weights digest its sidecar verified of what the engine serves (None: none)."""
    first_seen: datetime | None = None
    """When the operator first saw this replica report what it reports now (what it serves,
    with that digest): set by the reconciler; None until then."""

    @property
    def report_key(self) -> tuple[Identity | None, str | None]:
        """What a report claims: a change of it starts its standing afresh."""
        return (self.served_identity, self.digest)

    @property
    def ordinal(self) -> int | None:
        """The StatefulSet ordinal from the name (``demo-3`` → 3), or None."""
        match = _ORDINAL.search(self.name)
        return int(match.group(1)) if match else None

    def is_desired(self, replicas: int) -> bool:
        """A replica the deployment wants now: not terminating, ordinal below ``replicas``."""
        ordinal = self.ordinal
        return not self.terminating and ordinal is not None and ordinal < replicas

    @property
    def load_path(self) -> LoadPath | None:
        try:
            return LoadPath(self.via) if self.via else None
        except ValueError:
            return None


def _state(value: str | None) -> ReplicaState | None:
    try:
        return ReplicaState(value) if value else None
    except ValueError:
        return None


def _switch_phase(value: str | None) -> SwitchPhase | None:
    try:
        return SwitchPhase(value) if value else None
    except ValueError:
        return None


def _gate_is_true(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == (
            contract.CONDITION_SNAPSHOT_READY
        ):
            return condition.get("status") == "True"
    return False


def pod_report(body: Mapping[str, Any]) -> PodReport | None:
    """The report of a replica pod's body (as the API returns it); None if it is not ours."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    deployment = labels.get(INSTANCE_LABEL)
    name = metadata.get("name")
    if not deployment or not name:
        return None
    notes: Mapping[str, str] = metadata.get("annotations") or {}
    status = body.get("status") or {}
    return PodReport(
        name=name,
        namespace=metadata.get("namespace") or "",
        uid=metadata.get("uid") or "",
        resource_version=metadata.get("resourceVersion") or "",
        deployment=deployment,
        created=parse_time(metadata.get("creationTimestamp")),
        terminating=metadata.get("deletionTimestamp") is not None,
        served_identity=notes.get(contract.ANNOTATION_SNAPSHOT) or None,
        target_identity=notes.get(contract.ANNOTATION_TARGET) or None,
        state=_state(notes.get(contract.ANNOTATION_STATE)),
        since=parse_time(notes.get(contract.ANNOTATION_SINCE)),
        via=notes.get(contract.ANNOTATION_VIA) or None,
        reason=notes.get(contract.ANNOTATION_REASON) or None,
        message=notes.get(contract.ANNOTATION_MESSAGE) or None,
        failed_identity=notes.get(contract.ANNOTATION_FAILED_SNAPSHOT) or None,
        serves_verified=_gate_is_true(status),
        switch_phase=_switch_phase(notes.get(contract.ANNOTATION_SWITCH)),
        digest=notes.get(contract.ANNOTATION_DIGEST) or None,
    )
