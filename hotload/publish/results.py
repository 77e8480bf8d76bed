"""What one publish did, per region: the answer ``hotload publish -o json`` prints.

Every region gets its own result, whatever happened elsewhere: one region failing never
hides or blocks the others' outcome.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from hotload.api import SnapshotKind
from hotload.api.switch import SwitchDecision


class RegionOutcome(StrEnum):
    """How a snapshot ended in one region."""

    READY = "Ready"
    """Every desired replica serves it (Ready, reason Rolled)."""
    SUPERSEDED = "Superseded"
    """Ready because every replica already serves a newer snapshot."""
    APPLIED = "Applied"
    """Uploaded and applied; not waited on."""
    CHAIN_BROKEN = "ChainBroken"
    """The region's operator marked it ChainValid=False: a Full follows."""
    TIMED_OUT = "TimedOut"
    """Applied, but not Ready within the wait's deadline."""
    PENDING = "Pending"
    """Not applied yet (the region did not answer): kept, and applied in order with the
    next publish or ``Publisher.flush``."""
    FAILED = "Failed"
    """Refused for good (e.g. a snapshot of that name with another spec exists)."""
    SWITCH_ABORTED = "SwitchAborted"
    """Its coordinated switch was aborted: no replica switches to it."""

    @property
    def ok(self) -> bool:
        return self in (RegionOutcome.READY, RegionOutcome.SUPERSEDED, RegionOutcome.APPLIED)


class ResultModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )


class RegionResult(ResultModel):
    """One region's part of a publish."""

    context: str
    """The kube context of the region."""
    outcome: RegionOutcome
    bucket_url: str | None = None
    """The region's bucket (from its RolloutDeployment), once known."""
    uploaded_bytes: int = 0
    """Bytes this publish wrote to this region's bucket (0 when replication copies them)."""
    upload_seconds: float | None = None
    applied_seconds: float | None = None
    """From the start of the publish until the PolicySnapshot was applied here."""
    ready_seconds: float | None = None
    """From the start of the publish until the region's Ready condition turned True."""
    ready_replicas: int | None = None
    desired_replicas: int | None = None
    caught_up: list[str] = Field(default_factory=list)
    """Earlier snapshots this region had missed, applied before this one."""
    pending: list[str] = Field(default_factory=list)
    """Snapshots still waiting to be applied here (this one included when PENDING)."""
    error: str | None = None
    """What went wrong, when something did."""


class SwitchResult(ResultModel):
    """A coordinated switch (docs/operator.md, "Coordinated switch"), as the publisher
    decided it."""

    decision: SwitchDecision
    """Committed or Aborted (the decision written); Staging when the publisher could
    write it nowhere (the regions presume at ``deadline``)."""
    at: str | None = None
    """The committed switch time (RFC 3339 UTC, ms)."""
    deadline: str
    """The ``hotload.dev/switch-by`` every region's snapshot carries."""
    all_staged: bool
    """Every replica of every coordinated region was Staged when it decided."""
    staged_seconds: float | None = None
    """From the start of the publish until every replica was Staged (None: never)."""
    staged: dict[str, str] = Field(default_factory=dict)
    """Context → ``staged/desired`` replicas when it decided (``?`` where unknown)."""
    undelivered: list[str] = Field(default_factory=list)
    """Contexts that did not take the decision yet: it is queued, written with the next
    publish or ``Publisher.flush`` (until then the region presumes at the deadline)."""


class RankResult(ResultModel):
    """One rank's part of a sharded publish."""

    rank: int
    stored_bytes: int
    """Bytes of the payload file this rank wrote (its blocks, encoded)."""
    tensor_bytes: int
    """Bytes of the blocks it held and encoded."""
    encode_seconds: float
    encode_cpu_seconds: float
    """CPU time of the thread that encoded (without the codec's extra threads)."""


class CheckpointResult(ResultModel):
    """One attempt at publishing a checkpoint beside the chain, ended."""

    identity: str
    of: str
    step: int
    complete: bool
    """Complete in every region's bucket; later deltas name it."""
    error: str | None = None
    """Why it failed (it is tried again at the next publish)."""
    stored_bytes: int = 0
    seconds: float


class PublishResult(ResultModel):
    """One snapshot, published: what it is and what every region did with it."""

    identity: str
    step: int
    kind: SnapshotKind
    previous: str | None = None
    why: str
    """Why this kind: ``first``, ``cadence``, ``requested``, ``chain-broken``, ``lora``,
    ``delta`` (an Incremental against the previous snapshot), ``checkpoint`` (a delta
    whose weights also go out as a checkpoint beside the chain)."""
    stored_bytes: int
    """Bytes of every file the snapshot stores (the manifest included)."""
    full_bytes: int
    """Bytes of the full weights' tensor data."""
    blocked_seconds: float
    """How long the caller (the training step) was blocked: the copy of its weights."""
    encode_seconds: float
    seconds: float
    """From the call until every region's outcome was known."""
    regions: dict[str, RegionResult]
    fallback: PublishResult | None = None
    """The automatic Full published because a region broke this snapshot's chain."""
    switch: SwitchResult | None = None
    """The coordinated switch of this snapshot (None where no region is Coordinated)."""
    skipped_steps: list[int] = Field(default_factory=list)
    """Steps handed to ``publish`` before this one and never published: the publisher was
    behind, so this newer step replaced them (a direct delta from the last snapshot
    published, or a Full). Their handles resolve to this result."""
    ranks: list[RankResult] = Field(default_factory=list)
    """A sharded publish: what each rank encoded (empty for one process)."""
    checkpoint: str | None = None
    """The checkpoint this delta names (complete in every region's bucket), if any."""
    checkpoint_begun: str | None = None
    """The checkpoint of this step's weights that began beside the chain, if any."""
    checkpoint_done: list[CheckpointResult] = Field(default_factory=list)
    """Checkpoint attempts that ended since the previous publish."""

    @property
    def ratio(self) -> float:
        """Full tensor bytes / stored bytes (CONTRACTS.md's compression ratio)."""
        return self.full_bytes / self.stored_bytes if self.stored_bytes else 0.0

    @property
    def ok(self) -> bool:
        """Every region ended Ready, Superseded or Applied (or the fallback Full did)."""
        if self.fallback is not None:
            return self.fallback.ok
        if self.switch is not None and self.switch.decision is SwitchDecision.ABORTED:
            return False
        return all(region.outcome.ok for region in self.regions.values())
