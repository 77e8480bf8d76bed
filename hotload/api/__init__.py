"""hotload's API: pydantic models of both CRDs, the pod contract, and the shared reasons.

The one source of truth for every other layer; imports nothing of ours but
``hotload.errors``.
"""

from hotload.api import conditions, pod, reasons
from hotload.api.conditions import Condition, ConditionStatus, set_condition
from hotload.api.group import API_VERSION, GROUP, VERSION
from hotload.api.policy_snapshot import (
    DeploymentRef,
    IncrementalSpec,
    LoadPath,
    PolicySnapshot,
    PolicySnapshotSpec,
    PolicySnapshotStatus,
    ReplicaRecord,
    ReplicaState,
    SnapshotPhase,
)
from hotload.api.rollout_deployment import (
    EngineKind,
    EngineSpec,
    HotLoadSpec,
    ModelSpec,
    RolloutDeployment,
    RolloutDeploymentSpec,
    RolloutDeploymentStatus,
    Transition,
)
from hotload.api.snapshot_ref import (
    IDENTITY_PATTERN,
    KvCachePolicy,
    SnapshotKind,
    SnapshotRef,
    snapshot_order,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "IDENTITY_PATTERN",
    "VERSION",
    "Condition",
    "ConditionStatus",
    "DeploymentRef",
    "EngineKind",
    "EngineSpec",
    "HotLoadSpec",
    "IncrementalSpec",
    "KvCachePolicy",
    "LoadPath",
    "ModelSpec",
    "PolicySnapshot",
    "PolicySnapshotSpec",
    "PolicySnapshotStatus",
    "ReplicaRecord",
    "ReplicaState",
    "RolloutDeployment",
    "RolloutDeploymentSpec",
    "RolloutDeploymentStatus",
    "SnapshotKind",
    "SnapshotPhase",
    "SnapshotRef",
    "Transition",
    "conditions",
    "pod",
    "reasons",
    "set_condition",
    "snapshot_order",
]
