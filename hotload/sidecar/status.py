"""What ``/status`` answers: where the agent stands, its recent swaps, its last error.

The agent keeps one :class:`AgentStatus` (mutable, owned by the agent) and renders it to
the pydantic :class:`StatusReport` at the HTTP edge. Timestamps are RFC 3339 UTC.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from hotload.api import LoadPath, ReplicaState, SnapshotRef
from hotload.api.kinds import Identity


class Phase(StrEnum):
    """What the agent is doing right now."""

    WAITING = "Waiting"
    """No target yet, or the deployment is missing."""
    IDLE = "Idle"
    """Serving the target; nothing to do."""
    PLANNING = "Planning"
    FETCHING = "Fetching"
    VERIFYING = "Verifying"
    REBUILDING = "Rebuilding"
    DRAINING = "Draining"
    """SYNC: new requests get 425 while in-flight ones finish on the old weights."""
    SWAPPING = "Swapping"
    RELOADING = "Reloading"
    """Loading the served buffer again (the engine restarted, or a load left its
    weights unknown), or settling a load whose outcome was not known."""
    CONFIRMING = "Confirming"
    """The engine names a snapshot no buffer holds; its check against the manifest has
    not concluded (the bucket did not answer): nothing is loaded over it meanwhile."""
    RETRYING = "Retrying"
    """A transient failure; waiting before the next attempt."""
    FAILED = "Failed"
    """The target cannot be loaded; serving the last good snapshot."""


def now_utc() -> datetime:
    return datetime.now(UTC)


class _Model(BaseModel):
    """camelCase on the wire, like every other object hotload shows."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel)


class ErrorRecord(_Model):
    reason: str
    message: str
    transient: bool
    target: str | None = None
    at: datetime


def current_error(error: ErrorRecord | None, target: SnapshotRef | None) -> ErrorRecord | None:
    """``lastError`` as it concerns the target now: an error recorded for another target
    says nothing about this one and is dropped once the target moves (a failed load stays
    in the swap history). With no target, the last error stays."""
    if error is None or target is None or error.target == target.identity:
        return error
    return None


class SwapRecord(_Model):
    """One load attempt that reached an end (swapped, or failed for good)."""

    identity: Identity
    step: int
    kind: str
    via: LoadPath | None = None
    outcome: ReplicaState
    reason: str | None = None
    started_at: datetime
    finished_at: datetime
    seconds: dict[str, float] = Field(default_factory=dict)
    """Per phase: fetch, verify, rebuild, swap (plus total)."""
    fetched_bytes: int = 0
    """Bytes read from the bucket by the attempt that succeeded (manifests included;
    bytes a resumed download already had are not read again)."""
    stored_bytes: int = 0
    """Bytes of every file the plan needed, manifests included (fetched now, resumed, or
    already local): the bytes a load moves when nothing is resumed."""
    in_engine: bool = False
    """The delta was patched into the engine's live weights (no directory was loaded;
    staging catches up after Ready)."""


class EngineSeen(_Model):
    """The engine's own last answer (what the pod's report is checked against)."""

    identity: Identity | None
    instance_id: str | None
    answered: bool
    """False: it did not answer the last check."""
    at: datetime


class BuffersReport(_Model):
    """The two staging buffers: what each holds and their roles."""

    a: str | None
    b: str | None
    served: str | None
    """``a`` or ``b``: the buffer the engine serves from (never written while it is)."""
    handed: str | None
    """A buffer handed to the engine whose load outcome is not known yet."""


class StatusReport(_Model):
    """The body of ``GET /status``."""

    pod: str
    namespace: str
    deployment: str
    current: SnapshotRef | None
    target: SnapshotRef | None
    state: ReplicaState | None
    phase: Phase
    via: LoadPath | None
    since: datetime
    bytes_done: int
    bytes_total: int
    engine: str | None
    transition: str | None
    history: list[SwapRecord]
    last_error: ErrorRecord | None
    engine_seen: EngineSeen | None = None
    buffers: BuffersReport | None = None


@dataclass
class AgentStatus:
    """The agent's live state; the HTTP front and the reporter read it."""

    current: SnapshotRef | None = None
    current_via: LoadPath | None = None
    target: SnapshotRef | None = None
    state: ReplicaState | None = None
    reason: str | None = None
    """Why the state is Failed (a reason word of ``hotload.api.reasons``)."""
    message: str | None = None
    phase: Phase = Phase.WAITING
    since: datetime = field(default_factory=now_utc)
    bytes_done: int = 0
    bytes_total: int = 0
    last_error: ErrorRecord | None = None
    history: deque[SwapRecord] = field(default_factory=lambda: deque(maxlen=20))
    engine_seen: EngineSeen | None = None
    buffers: BuffersReport | None = None

    def report(
        self,
        *,
        pod: str,
        namespace: str,
        deployment: str,
        engine: str | None,
        transition: str | None,
    ) -> StatusReport:
        return StatusReport(
            pod=pod,
            namespace=namespace,
            deployment=deployment,
            current=self.current,
            target=self.target,
            state=self.state,
            phase=self.phase,
            via=self.current_via,
            since=self.since,
            bytes_done=self.bytes_done,
            bytes_total=self.bytes_total,
            engine=engine,
            transition=transition,
            history=list(reversed(self.history)),
            last_error=self.last_error,
            engine_seen=self.engine_seen,
            buffers=self.buffers,
        )
