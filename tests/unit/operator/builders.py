"""Small builders for the operator's planner tables: snapshots, pods, observations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from hotload.api import (
    ConditionStatus,
    ReplicaState,
    RolloutDeploymentSpec,
    SnapshotKind,
    SnapshotRef,
)
from hotload.operator.ledger import parse_ledger
from hotload.operator.plan import Observation, ObservedDeployment
from hotload.operator.pods import PodReport
from hotload.operator.rollout import ChainVerdict, Checkpoint, SnapshotInfo
from hotload.operator.snapshot_status import ObservedSnapshot

T0 = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
DEPLOYMENT = "demo"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def full(identity: str, step: int, deployment: str = DEPLOYMENT, **kw: Any) -> SnapshotInfo:
    return SnapshotInfo(identity, deployment, step, SnapshotKind.FULL, **kw)


def delta(
    identity: str, step: int, previous: str, deployment: str = DEPLOYMENT, **kw: Any
) -> SnapshotInfo:
    kw.setdefault("compression_format", "hotload-delta/v1")
    kw.setdefault("checksum_format", "sha256")
    return SnapshotInfo(
        identity, deployment, step, SnapshotKind.INCREMENTAL, previous=previous, **kw
    )


def ckpt(of: str) -> Checkpoint:
    """The checkpoint of ``of`` a delta names (a Full in the bucket, no PolicySnapshot)."""
    return Checkpoint(f"{of}-full", of)


def valid() -> ChainVerdict:
    return ChainVerdict(ConditionStatus.TRUE, "ChainComplete", "")


def broken(reason: str = "ChecksumMismatch") -> ChainVerdict:
    return ChainVerdict(ConditionStatus.FALSE, reason, "bad")


def by_identity(*infos: SnapshotInfo) -> dict[str, SnapshotInfo]:
    return {info.identity: info for info in infos}


def pod(
    ordinal: int,
    snapshot: str | None = None,
    *,
    target: str | None = None,
    state: ReplicaState | None = None,
    since: datetime | None = None,
    via: str | None = None,
    reason: str | None = None,
    message: str | None = None,
    failed_snapshot: str | None = None,
    verified: bool | None = None,
    terminating: bool = False,
    deployment: str = DEPLOYMENT,
    digest: str | None = None,
    first_seen: datetime | None = T0 - timedelta(minutes=1),
) -> PodReport:
    """A replica pod; by default Ready at ``snapshot`` (its target) when it serves one."""
    if state is None and snapshot is not None:
        state = ReplicaState.READY
    return PodReport(
        name=f"{deployment}-{ordinal}",
        namespace="ns",
        uid=f"uid-{ordinal}",
        resource_version=str(100 + ordinal),
        deployment=deployment,
        created=T0,
        terminating=terminating,
        served_identity=snapshot,
        target_identity=target if target is not None else snapshot,
        state=state,
        since=since or T0,
        via=via or ("full" if snapshot else None),
        reason=reason,
        message=message,
        failed_identity=failed_snapshot,
        serves_verified=verified if verified is not None else snapshot is not None,
        digest=digest,
        first_seen=first_seen,
    )


def observed_snapshot(
    info: SnapshotInfo,
    status: Mapping[str, Any] | None = None,
    created: datetime = T0,
    *,
    finalizers: tuple[str, ...] = (),
    announced: bool = False,
) -> ObservedSnapshot:
    status = dict(status or {})
    ledger = parse_ledger(status.get("replicas"))
    return ObservedSnapshot(
        info, f"uid-{info.identity}", created, 1, status, ledger, finalizers, announced
    )


def spec(replicas: int = 3, keep: int = 10) -> RolloutDeploymentSpec:
    return RolloutDeploymentSpec.model_validate(
        {
            "model": {"name": "tiny", "servedName": "policy"},
            "engine": {"kind": "noop"},
            "replicas": replicas,
            "hotLoad": {"bucketUrl": "file:///tmp/bucket"},
            "retention": {"keepSnapshots": keep},
        }
    )


def observation(
    snapshots: Iterable[ObservedSnapshot],
    pods: Iterable[PodReport],
    *,
    replicas: int = 3,
    keep: int = 10,
    status: Mapping[str, Any] | None = None,
    written_target: SnapshotRef | None = None,
) -> Observation:
    return Observation(
        deployment=ObservedDeployment(
            name=DEPLOYMENT,
            namespace="ns",
            uid="uid-rd",
            generation=1,
            spec=spec(replicas, keep),
            status=dict(status or {}),
            written_target=written_target,
        ),
        pods=list(pods),
        snapshots={snap.info.identity: snap for snap in snapshots},
    )
