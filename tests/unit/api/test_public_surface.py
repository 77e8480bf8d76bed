"""The public names of ``hotload.api``: a rename is a deliberate act; importing it pulls
nothing of ours but ``hotload.errors`` (every layer imports the API)."""

from __future__ import annotations

import subprocess
import sys

import hotload.api


def test_public_names_are_pinned() -> None:
    assert sorted(hotload.api.__all__) == [
        "API_VERSION",
        "CheckpointRef",
        "Condition",
        "ConditionStatus",
        "DeploymentRef",
        "EngineKind",
        "EngineSpec",
        "GROUP",
        "HotLoadSpec",
        "IDENTITY_PATTERN",
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
        "VERSION",
        "conditions",
        "pod",
        "reasons",
        "set_condition",
        "snapshot_order",
    ]


def test_every_public_name_exists() -> None:
    missing = [name for name in hotload.api.__all__ if not hasattr(hotload.api, name)]
    assert missing == []


def test_importing_the_api_imports_nothing_else_of_ours() -> None:
    probe = "import sys, hotload.api; print(' '.join(m for m in sys.modules if 'hotload.' in m))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    ours = {name.split(".")[1] for name in result.stdout.split()}
    assert ours <= {"api", "errors"}
