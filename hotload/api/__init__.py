"""hotload's API: pydantic models of both CRDs, the pod contract, and the shared reasons.

The one source of truth for every other layer; imports nothing of ours but
``hotload.errors``.

Names load on first use (PEP 562 ``__getattr__``): a process that needs one enum does
not build every CRD model (pydantic schema building is most of this package's import
time, and ``hotload snapshot`` pays it on every start). ``__all__`` is the surface.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from hotload.api import conditions, pod, reasons
    from hotload.api.conditions import Condition, ConditionStatus, set_condition
    from hotload.api.group import API_VERSION, GROUP, VERSION
    from hotload.api.kinds import IDENTITY_PATTERN, KvCachePolicy, SnapshotKind
    from hotload.api.policy_snapshot import (
        CheckpointRef,
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
    from hotload.api.snapshot_ref import SnapshotRef, snapshot_order

#: Where each public name lives (the submodules themselves are public too).
_HOMES: Final = {
    "Condition": "hotload.api.conditions",
    "ConditionStatus": "hotload.api.conditions",
    "set_condition": "hotload.api.conditions",
    "API_VERSION": "hotload.api.group",
    "GROUP": "hotload.api.group",
    "VERSION": "hotload.api.group",
    "DeploymentRef": "hotload.api.policy_snapshot",
    "CheckpointRef": "hotload.api.policy_snapshot",
    "IncrementalSpec": "hotload.api.policy_snapshot",
    "LoadPath": "hotload.api.policy_snapshot",
    "PolicySnapshot": "hotload.api.policy_snapshot",
    "PolicySnapshotSpec": "hotload.api.policy_snapshot",
    "PolicySnapshotStatus": "hotload.api.policy_snapshot",
    "ReplicaRecord": "hotload.api.policy_snapshot",
    "ReplicaState": "hotload.api.policy_snapshot",
    "SnapshotPhase": "hotload.api.policy_snapshot",
    "EngineKind": "hotload.api.rollout_deployment",
    "EngineSpec": "hotload.api.rollout_deployment",
    "HotLoadSpec": "hotload.api.rollout_deployment",
    "ModelSpec": "hotload.api.rollout_deployment",
    "RolloutDeployment": "hotload.api.rollout_deployment",
    "RolloutDeploymentSpec": "hotload.api.rollout_deployment",
    "RolloutDeploymentStatus": "hotload.api.rollout_deployment",
    "Transition": "hotload.api.rollout_deployment",
    "IDENTITY_PATTERN": "hotload.api.kinds",
    "KvCachePolicy": "hotload.api.kinds",
    "SnapshotKind": "hotload.api.kinds",
    "SnapshotRef": "hotload.api.snapshot_ref",
    "snapshot_order": "hotload.api.snapshot_ref",
    "conditions": "hotload.api.conditions",
    "pod": "hotload.api.pod",
    "reasons": "hotload.api.reasons",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = import_module(home)
    value = module if home.endswith(f".{name}") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "API_VERSION",
    "GROUP",
    "IDENTITY_PATTERN",
    "VERSION",
    "CheckpointRef",
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
