"""``RolloutDeployment``: a regional pool of inference replicas that hot-loads snapshots."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import Field, model_validator

from hotload.api._base import ApiModel, ApiStatusModel
from hotload.api.conditions import Condition
from hotload.api.identity import ValidIdentity
from hotload.api.kinds import KvCachePolicy
from hotload.api.snapshot_ref import SnapshotRef
from hotload.api.switch import StagingTimeoutAction, SwitchMode

KIND: Final = "RolloutDeployment"
PLURAL: Final = "rolloutdeployments"
SINGULAR: Final = "rolloutdeployment"
SHORT_NAMES: Final = ("rd",)
#: Keys of the Secret ``spec.engine.keysSecretRef`` names.
ENGINE_API_KEY_SECRET_KEY: Final = "api-key"
ENGINE_ADMIN_API_KEY_SECRET_KEY: Final = "admin-api-key"
#: Environment of the engine and sidecar containers carrying those keys.
ENV_ENGINE_API_KEY: Final = "HOTLOAD_ENGINE_API_KEY"
ENV_ENGINE_ADMIN_API_KEY: Final = "HOTLOAD_ENGINE_ADMIN_API_KEY"

#: Free-form Kubernetes structures we pass through to the pod template untouched.
KubeObject = Annotated[
    dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
]


class EngineKind(StrEnum):
    REFERENCE = "reference"
    """Our small transformers-based server (CPU demos and tests)."""
    SGLANG = "sglang"
    VLLM = "vllm"
    NOOP = "noop"
    """Accepts every swap at once and serves nothing: scale runs only."""


class Transition(StrEnum):
    ASYNC = "ASYNC"
    """In-flight requests pause at the swap and resume on the new weights."""
    SYNC = "SYNC"
    """In-flight requests finish on the old weights; new ones get 425 until the swap ends."""


class ModelSpec(ApiModel):
    """Which model the replicas serve."""

    name: Annotated[str, Field(min_length=1, max_length=512)]
    """Base model name (what the engine is started with)."""
    served_name: Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^@\s]+$")]
    """Name clients ask for; responses say `<servedName>@<identity>`."""


class SecretRef(ApiModel):
    """A Secret in the deployment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253)]


class EngineSpec(ApiModel):
    """The inference engine container."""

    kind: EngineKind
    """reference, sglang, vllm or noop."""
    image: Annotated[str, Field(min_length=1)] = "hotload:dev"
    """Container image of the engine."""
    args: list[str] = Field(default_factory=list)
    """Extra arguments for the engine."""
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    """Port the engine listens on, on the pod's IP."""
    resources: KubeObject = Field(default_factory=dict)
    """Container resources (requests/limits), e.g. {limits: {nvidia.com/gpu: 1}}."""
    verify_digest: bool = False
    """Check the engine's own weights checksum after each swap (SGLang, vLLM; costly)."""
    keys_secret_ref: SecretRef | None = None
    """Secret with the engine's `api-key` and (SGLang only) `admin-api-key`."""
    launch_version: Annotated[str, Field(min_length=1, max_length=256)] = "default"
    """The weight version the engine reports before any load (SGLang `--weight-version`,
    vLLM `default`): it names no snapshot. Set it when you start SGLang with another."""


class HotLoadSpec(ApiModel):
    """Where snapshots come from and how they are swapped in."""

    bucket_url: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^(file|s3)://.+")]
    """This region's bucket prefix: file:///path or s3://bucket/prefix."""
    credentials_secret_ref: SecretRef | None = None
    """Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3:// buckets."""
    endpoint: Annotated[str | None, Field(pattern=r"^https?://.+")] = None
    """S3-compatible endpoint URL (MinIO, Nebius, GCS interop); unset means AWS."""
    region: str | None = None
    """S3 region name, where the service needs one."""
    transition: Transition = Transition.ASYNC
    """ASYNC (pause and resume in-flight requests) or SYNC (drain; new requests get 425)."""
    kv_cache_policy: KvCachePolicy = KvCachePolicy.ALL
    """Default KV-cache policy after a swap: all, none or new_session."""
    max_stale_steps: Annotated[int | None, Field(ge=1)] = None
    """When set, a replica more than this many steps behind the target is not Ready."""

    @model_validator(mode="after")
    def _s3_settings_need_an_s3_bucket(self) -> HotLoadSpec:
        if not self.bucket_url.startswith("s3://"):
            for name, value in (
                ("endpoint", self.endpoint),
                ("credentialsSecretRef", self.credentials_secret_ref),
            ):
                if value is not None:
                    raise ValueError(f"hotLoad.{name} is only used with s3:// buckets")
        return self


class SidecarSpec(ApiModel):
    """The weight-swap sidecar container."""

    image: Annotated[str, Field(min_length=1)] = "hotload:dev"
    resources: KubeObject = Field(default_factory=dict)


class SchedulingSpec(ApiModel):
    """Where replicas may run."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[KubeObject] = Field(default_factory=list)
    affinity: KubeObject = Field(default_factory=dict)


class RetentionSpec(ApiModel):
    """How many PolicySnapshot objects of this deployment the operator keeps in this region."""

    keep_snapshots: Annotated[int, Field(ge=1)] = 10
    """Older ones are deleted (never the target, current, or the newest Full they need)."""


class RolloutSpec(ApiModel):
    """How a new target reaches the replicas (docs/operator.md, "Coordinated switch")."""

    switch: SwitchMode = SwitchMode.INDEPENDENT
    """Independent: each replica swaps as soon as it is ready. Coordinated: every replica of
    every region stages the target, reports Staged, and swaps at the one time the publisher
    commits (the PolicySnapshot annotation hotload.dev/switch-at, copied by the operator
    into status.targetSnapshot.switchAt). Protocol, failure cases and clock skew:
    docs/operator.md."""
    staging_timeout_seconds: Annotated[int, Field(ge=1, le=86400)] = 300
    """Coordinated: how long the publisher waits, from its publish, for every replica of
    every region to be Staged before it decides without the others (onStagingTimeout)."""
    lead_milliseconds: Annotated[int, Field(ge=0, le=600000)] = 2000
    """Coordinated: the switch time is the decision plus this lead, so that the commit
    reaches every replica (publisher, operator, sidecar watch) before it."""
    on_staging_timeout: StagingTimeoutAction = StagingTimeoutAction.FOLLOW
    """Coordinated, replicas not Staged by the timeout: Follow (the others switch at the
    committed time; the late ones as soon as they are Staged, marked Late) or Abort (nobody
    switches: the target goes back to what the fleet serves). It is also what every replica
    presumes when no decision reaches it by the deadline (the publisher died): Follow
    switches at the deadline, Abort goes back."""


class RolloutDeploymentSpec(ApiModel):
    """The desired pool."""

    model: ModelSpec
    engine: EngineSpec
    replicas: Annotated[int, Field(ge=0)] = 1
    """Number of inference replicas (pods) in this region."""
    hot_load: HotLoadSpec
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    retention: RetentionSpec = Field(default_factory=RetentionSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)


class TargetRollback(ApiStatusModel):
    """The operator's record of its one backward move (the target turned out broken or was
    deleted: back to the newest valid snapshot). A sidecar follows a target that ranks
    below what it serves only when this record names that target: a target moved back by
    any other writer is refused and repaired (docs/operator.md, "A target moved by hand")."""

    from_identity: ValidIdentity
    """The target it moved back from."""
    to_identity: ValidIdentity
    """The target it moved back to (``targetSnapshot.identity`` while the record stands)."""
    at: datetime
    """When the operator moved it."""


class RolloutDeploymentStatus(ApiStatusModel):
    """Kept small on purpose: every sidecar watches this object."""

    observed_generation: Annotated[int | None, Field(ge=0)] = None
    target_snapshot: SnapshotRef | None = None
    """The snapshot every replica should serve."""
    current_snapshot: SnapshotRef | None = None
    """The newest snapshot that every replica serves."""
    replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas that exist."""
    ready_replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas that serve a verified snapshot (their readiness gate is True)."""
    updated_replicas: Annotated[int, Field(ge=0)] = 0
    """Replicas at the target."""
    selector: str | None = None
    """Label selector of the replicas' pods (for the scale subresource)."""
    replicas_by_state: dict[str, int] = Field(default_factory=dict)
    """Counts by sidecar state (Loading, Ready, Failed)."""
    replicas_by_snapshot: dict[str, int] = Field(default_factory=dict)
    """Counts by served snapshot identity."""
    conditions: list[Condition] = Field(default_factory=list)
    """Available, Progressing, SnapshotReady, Degraded."""
    rollback: TargetRollback | None = None
    """Set with a backward move of the target by the operator, cleared by the next forward
    move."""
    fence: str | None = None
    """The fence token (``<holder>/<leaseTransitions>`` of the region's leader Lease) of the
    operator that wrote this status last: a writer that lost the Lease cannot write."""


class RolloutDeployment(ApiModel):
    """A regional pool of inference replicas kept on the freshest policy without restarts."""

    api_version: str = "hotload.dev/v1alpha1"
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RolloutDeploymentSpec
    status: RolloutDeploymentStatus | None = None

    model_config = ApiModel.model_config | {"extra": "ignore"}
