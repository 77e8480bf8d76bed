"""``PolicySnapshot``: one published snapshot, applied by the trainer to each region."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import Field, field_serializer, model_validator

from hotload.api._base import ApiModel, ApiStatusModel
from hotload.api.conditions import Condition, rfc3339
from hotload.api.formats import FORMAT_V1, FileHash
from hotload.api.identity import ValidIdentity
from hotload.api.kinds import KvCachePolicy, SnapshotKind
from hotload.api.snapshot_ref import SnapshotRef
from hotload.api.switch import SwitchDecision, SwitchPhase, switch_time

KIND: Final = "PolicySnapshot"
PLURAL: Final = "policysnapshots"
SINGULAR: Final = "policysnapshot"
SHORT_NAMES: Final = ("psnap",)

DEFAULT_COMPRESSION_FORMAT: Final = FORMAT_V1
DEFAULT_CHECKSUM_FORMAT: Final = FileHash.SHA256.value


class DeploymentRef(ApiModel):
    """The RolloutDeployment (same namespace) this snapshot is for."""

    name: Annotated[str, Field(min_length=1, max_length=253)]


class CheckpointRef(ApiModel):
    """A Full of the same weights as a snapshot of this delta's chain, published beside the
    chain (docs/snapshot-format.md, "Checkpoints"): a replica that holds nothing of the
    chain after ``of`` loads ``identity`` and the deltas after ``of``, and nothing older
    than ``of`` is needed any more."""

    identity: ValidIdentity
    """The checkpoint: a Full, in the bucket, with no PolicySnapshot of its own."""
    of: ValidIdentity
    """The snapshot of this delta's chain whose weights the checkpoint holds."""


class IncrementalSpec(ApiModel):
    """How a delta relates to the snapshot before it."""

    previous_identity: ValidIdentity
    """The snapshot this delta applies to."""
    compression_format: Annotated[str, Field(min_length=1, max_length=128)] = (
        DEFAULT_COMPRESSION_FORMAT
    )
    """Format and version of the delta files, e.g. hotload-delta/v1."""
    checksum_format: Annotated[str, Field(min_length=1, max_length=64)] = DEFAULT_CHECKSUM_FORMAT
    """Hash of the stored files: sha256 (adler32 accepted for compatibility)."""
    checkpoint: CheckpointRef | None = None
    """The newest checkpoint of this delta's chain, as its manifest names it."""


class PolicySnapshotSpec(ApiModel):
    """Immutable once created: a snapshot is a fact, not a wish."""

    deployment_ref: DeploymentRef
    identity: ValidIdentity
    """Equal to metadata.name; the bucket prefix of this snapshot."""
    step: Annotated[int, Field(ge=0)]
    """Trainer step, monotonic per deployment."""
    kind: SnapshotKind
    """Full, Incremental or LoRA."""
    incremental: IncrementalSpec | None = None
    """Required for (and only for) Incremental snapshots."""
    kv_cache_policy: KvCachePolicy | None = None
    """Overrides the deployment's default for this swap."""
    ignored_config_fields: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=64
    )
    """config.json keys that may change without forcing a full reload."""
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] | None = None
    """The rebuilt weights' tensor-set digest (xxh3-128 hex of the manifest's tensor
    hashes), as the trainer published it. When set, a replica counts toward Ready only when
    its report carries this digest, the one its sidecar verified of what the engine serves."""

    @model_validator(mode="after")
    def _kind_matches_incremental(self) -> PolicySnapshotSpec:
        if self.kind is SnapshotKind.INCREMENTAL and self.incremental is None:
            raise ValueError("an Incremental snapshot needs incremental.previousIdentity")
        if self.kind is not SnapshotKind.INCREMENTAL and self.incremental is not None:
            raise ValueError(
                f"a {self.kind.value} snapshot is complete and has no incremental section"
            )
        if self.incremental is not None and self.incremental.previous_identity == self.identity:
            raise ValueError(
                "incremental.previousIdentity must name another snapshot, not this one"
            )
        checkpoint = self.incremental.checkpoint if self.incremental is not None else None
        # The same three rules as the CRD's CEL (hotload.api.crd), so that what the API
        # server admits the models read, and what they read the server admits.
        if checkpoint is not None and self.identity in (checkpoint.identity, checkpoint.of):
            raise ValueError(
                "incremental.checkpoint names the checkpoint and an earlier snapshot of this "
                "delta's chain, not this one"
            )
        if checkpoint is not None and checkpoint.identity == checkpoint.of:
            raise ValueError(
                "incremental.checkpoint.identity (the Full) and incremental.checkpoint.of "
                "(the snapshot whose weights it holds) are two snapshots"
            )
        return self

    def ref(self, default_policy: KvCachePolicy) -> SnapshotRef:
        """The reference a deployment's status carries, with the cache policy resolved."""
        return SnapshotRef(
            identity=self.identity,
            step=self.step,
            kind=self.kind,
            kv_cache_policy=self.kv_cache_policy or default_policy,
        )


class ReplicaState(StrEnum):
    """Where a replica stands against the target (the sidecar's `state` annotation)."""

    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"


class LoadPath(StrEnum):
    """How a replica got its snapshot (the sidecar's `via` annotation)."""

    DELTA = "delta"
    FULL = "full"
    REPLAY = "replay"
    RELOAD = "reload"
    """The served snapshot loaded again from staging (after an engine restart or a load
    that may have left the engine's weights unknown)."""


class SnapshotPhase(StrEnum):
    PENDING = "Pending"
    """Accepted, not (yet) the target."""
    ROLLING = "Rolling"
    """The target; replicas are loading it."""
    READY = "Ready"
    """Every desired replica serves it or a newer snapshot."""
    FAILED = "Failed"
    """Its chain is broken; it will never be the target."""


class Corroboration(StrEnum):
    """Why the operator believes (or not yet) a replica's report that it serves a snapshot."""

    DIGEST = "Digest"
    """Its report carries the digest the snapshot declares (or, when it declares none, the
    one every replica serving it reports)."""
    STOOD = "Stood"
    """No digest could be had, or none declared to compare with: counted once the report
    stood unchallenged longer than a sidecar takes to repair a report it did not write."""
    PENDING = "Pending"
    """Not counted yet: the report has not stood long enough."""
    DISPUTED = "Disputed"
    """Its digest differs from the declared one (or from the other replicas'): never counted
    while it does."""


class ReplicaRecord(ApiStatusModel):
    """One replica's line in the ledger."""

    # The operator reads and writes the ledger by this model (hotload.operator.ledger).

    state: ReplicaState
    snapshot: str | None = None
    """Identity the replica serves now."""
    since: datetime | None = None
    via: LoadPath | None = None
    reason: str | None = None
    message: str | None = None
    phase: SwitchPhase | None = None
    """Coordinated switch only: Staged (state Loading, waiting for the switch time), OnTime
    or Late (state Ready: swapped at the switch time, or after it)."""
    digest: str | None = None
    """The weights digest the replica's sidecar verified of what its engine serves."""
    corroboration: Corroboration | None = None
    """Whether (and why) its report of what it serves counts toward Ready."""

    @field_serializer("since", when_used="json-unless-none")
    def _since_to_the_second(self, since: datetime) -> str:
        """Written as Kubernetes writes its own timestamps (to the second, ``Z``)."""
        return rfc3339(since)


class Propagation(ApiStatusModel):
    """When this snapshot reached the fleet (it was created at metadata.creationTimestamp).

    Times carry milliseconds: propagation is a measurement. Each is written once.
    """

    target_set_at: datetime | None = None
    """When the operator made it the deployment's target."""
    first_replica_ready_at: datetime | None = None
    """When the operator first saw a desired replica serve it (or a newer snapshot)."""
    all_replicas_ready_at: datetime | None = None
    """When every desired replica served it or a newer one (Ready turned True)."""


class SwitchRecord(ApiStatusModel):
    """A coordinated switch of this snapshot, as the operator sees it (docs/operator.md)."""

    decision: SwitchDecision
    """Staging, Committed, Presumed or Aborted."""
    at: datetime | None = None
    """The switch time (Committed, Presumed)."""
    by: datetime | None = None
    """The deadline: no decision by then, and replicas presume onStagingTimeout."""
    late_replicas: Annotated[int, Field(ge=0)] = 0
    """Desired replicas that swapped after the switch time."""

    @field_serializer("at", "by", when_used="json-unless-none")
    def _to_the_millisecond(self, moment: datetime) -> str:
        return switch_time(moment)


class PolicySnapshotStatus(ApiStatusModel):
    """Rollout progress of this snapshot and the per-replica ledger."""

    observed_generation: Annotated[int | None, Field(ge=0)] = None
    phase: SnapshotPhase | None = None
    desired_replicas: Annotated[int, Field(ge=0)] = 0
    """The deployment's spec.replicas now."""
    ready_replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas serving this snapshot or a newer one."""
    staged_replicas: Annotated[int, Field(ge=0)] = 0
    """Coordinated switch: desired replicas Staged for this snapshot or serving it or a
    newer one (the publisher commits once this equals desiredReplicas in every region)."""
    replicas_summary: str = ""
    """"ready/desired", preformatted for the printer column."""
    replicas: dict[str, ReplicaRecord] = Field(default_factory=dict)
    """The ledger, keyed by pod name (a map, so merge patches never replace it whole)."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, ChainValid."""
    propagation: Propagation | None = None
    """Target set, first replica ready, all replicas ready."""
    switch: SwitchRecord | None = None
    """Coordinated switch only: the decision, the switch time, the deadline."""
    sealed_at: datetime | None = None
    """When the record was finished (Ready latched and a newer snapshot targeted, or its
    chain broken): from then on its ledger, counts and Ready condition are never written
    again."""
    fence: str | None = None
    """The fence token (``<holder>/<leaseTransitions>`` of the region's leader Lease) of the
    operator that wrote this status last: a writer that lost the Lease cannot write."""


class PolicySnapshot(ApiModel):
    """One published snapshot of a policy: a full checkpoint, a lossless delta, or a LoRA."""

    api_version: str = "hotload.dev/v1alpha1"
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: PolicySnapshotSpec
    status: PolicySnapshotStatus | None = None

    model_config = ApiModel.model_config | {"extra": "ignore"}

    @model_validator(mode="after")
    def _identity_is_the_name(self) -> PolicySnapshot:
        name = self.metadata.get("name")
        if name is not None and name != self.spec.identity:
            raise ValueError(
                f"spec.identity {self.spec.identity!r} must equal metadata.name {name!r}"
            )
        return self
