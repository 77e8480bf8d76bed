"""The reconcile loop's own decisions: write order, coalescing, and its view of the world.

The executor is replaced by a recorder (the real one is exercised against the apiserver
by the integration tests); time is looptime's, so coalescing windows cost nothing.
Would catch: a target moved back before the break is recorded (the record would be lost
with the pod's report), count-only deployment writes not coalesced (every sidecar
watches the deployment), a reconciler that writes again what it just wrote.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from hotload.api import API_VERSION
from hotload.errors import KubeConflict
from hotload.operator.batching import BatchWindows
from hotload.operator.fencing import Standalone
from hotload.operator.metrics import OperatorMetrics
from hotload.operator.reconciler import DeploymentReconciler, ReconcileTiming


class RecordingExecutor:
    """Answers like the apiserver would (merge patches applied, a write conditioned on an
    older resourceVersion refused with 409), and records each call."""

    def __init__(self, deployment: dict[str, Any], snapshots: list[dict[str, Any]]) -> None:
        self.deployment = deployment
        self.snapshots = {s["metadata"]["name"]: s for s in snapshots}
        self.pods: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str]] = []
        self.version = 100
        self.leadership = Standalone()

    def _bump(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(body)

    def _precondition(self, body: dict[str, Any], version: str | None) -> None:
        if version is not None and version != body["metadata"]["resourceVersion"]:
            self.calls.append(("conflict", body["metadata"]["name"]))
            raise KubeConflict("the object has been modified", status=409)

    async def list_snapshots(self, namespace: str) -> dict[str, Any]:
        items = [copy.deepcopy(s) for s in self.snapshots.values()]
        return {"metadata": {"resourceVersion": str(self.version)}, "items": items}

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.deployment)

    async def patch_deployment_status(
        self, ns: str, name: str, status: Any, resource_version: str | None = None
    ) -> dict[str, Any]:
        self._precondition(self.deployment, resource_version)
        self.calls.append(("deployment", name))
        self.deployment["status"] = _merge(self.deployment.get("status") or {}, status)
        return self._bump(self.deployment)

    async def patch_snapshot_status(
        self, ns: str, name: str, status: Any, resource_version: str | None = None
    ) -> dict[str, Any]:
        body = self.snapshots[name]
        self._precondition(body, resource_version)
        self.calls.append(("snapshot", name))
        body["status"] = _merge(body.get("status") or {}, status)
        return self._bump(body)

    async def patch_snapshot_metadata(
        self, ns: str, name: str, metadata: Any, resource_version: str | None = None
    ) -> dict[str, Any]:
        body = self.snapshots[name]
        self._precondition(body, resource_version)
        self.calls.append(("metadata", name))
        body["metadata"] = _merge(body["metadata"], metadata)
        return self._bump(body)

    async def delete_snapshot(
        self, ns: str, name: str, uid: str, resource_version: str | None = None
    ) -> None:
        self.calls.append(("delete", name))
        self.snapshots.pop(name, None)

    async def apply(self, manifest: Any) -> dict[str, Any]:
        self.calls.append(("apply", manifest["kind"]))
        return {}

    async def emit(self, namespace: str, event: Any) -> None:
        self.calls.append(("event", event.reason))


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def deployment_body(replicas: int = 2, keep: int = 10) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "RolloutDeployment",
        "metadata": {"name": "demo", "namespace": "ns", "uid": "rd", "generation": 1,
                     "resourceVersion": "1"},
        "spec": {
            "model": {"name": "tiny", "servedName": "policy"},
            "engine": {"kind": "noop"},
            "replicas": replicas,
            "hotLoad": {"bucketUrl": "file:///tmp/b"},
            "retention": {"keepSnapshots": keep},
        },
    }  # fmt: skip


def snapshot_body(
    name: str, step: int, previous: str | None = None, checkpoint_of: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "deploymentRef": {"name": "demo"},
        "identity": name,
        "step": step,
        "kind": "Incremental" if previous else "Full",
    }
    if previous:
        spec["incremental"] = {"previousIdentity": previous}
    if checkpoint_of:
        spec["incremental"]["checkpoint"] = {"identity": f"{checkpoint_of}-full",
                                             "of": checkpoint_of}  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "generation": 1,
                     "resourceVersion": "2", "creationTimestamp": "2026-11-23T10:00:00Z"},
        "spec": spec,
    }  # fmt: skip


def pod_body(ordinal: int, version: int, **notes: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"demo-{ordinal}", "namespace": "ns", "uid": f"p{ordinal}",
            "resourceVersion": str(version), "creationTimestamp": "2026-11-23T10:00:00Z",
            "labels": {"app.kubernetes.io/instance": "demo",
                       "app.kubernetes.io/managed-by": "hotload"},
            "annotations": {f"hotload.dev/{k.replace('_', '-')}": v for k, v in notes.items()},
        },
        "status": {"conditions": [{"type": "hotload.dev/SnapshotReady", "status": "True"}]},
    }  # fmt: skip


def reconciler(executor: RecordingExecutor) -> DeploymentReconciler:
    timing = ReconcileTiming(windows=BatchWindows(0.5, 0.02), status_interval_s=2.0)
    made = DeploymentReconciler(
        "ns",
        "demo",
        executor,
        OperatorMetrics(),
        timing,
        "hotload-sidecar",  # type: ignore[arg-type]
    )
    made.on_deployment(executor.deployment)
    return made


async def test_a_break_is_recorded_on_its_snapshot_before_the_target_moves_back() -> None:
    executor = RecordingExecutor(
        deployment_body(), [snapshot_body("s0", 0), snapshot_body("s1", 1, "s0")]
    )
    loop = reconciler(executor)
    executor.pods = [pod_body(i, 10 + i, snapshot="s0", target="s0", state="Ready")
                     for i in range(2)]  # fmt: skip
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()
    assert executor.deployment["status"]["targetSnapshot"]["identity"] == "s1"
    executor.calls.clear()
    loop.on_pod("MODIFIED", pod_body(0, 20, snapshot="s0", target="s1", state="Failed",
                                      reason="DecodeFailed", failed_snapshot="s1"))  # fmt: skip
    await loop.reconcile()
    writes = [c for c in executor.calls if c[0] in ("snapshot", "deployment")]
    assert writes[0] == ("snapshot", "s1")
    assert ("deployment", "demo") in writes
    assert executor.deployment["status"]["targetSnapshot"]["identity"] == "s0"
    assert ("event", "TargetRolledBack") in executor.calls


async def test_a_reconcile_that_finds_nothing_new_writes_nothing() -> None:
    executor = RecordingExecutor(deployment_body(), [snapshot_body("s0", 0)])
    loop = reconciler(executor)
    executor.pods = [pod_body(i, 10 + i, snapshot="s0", target="s0", state="Ready")
                     for i in range(2)]  # fmt: skip
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()
    await loop.reconcile()  # a second pass: the first one's writes are its view now
    executor.calls.clear()
    await loop.reconcile()
    assert executor.calls == []


@pytest.mark.looptime
async def test_count_only_deployment_writes_are_coalesced_but_target_moves_are_not() -> None:
    executor = RecordingExecutor(deployment_body(replicas=3), [snapshot_body("s0", 0)])
    loop = reconciler(executor)
    executor.pods = [pod_body(0, 10, snapshot="s0", target="s0", state="Ready")] + [
        pod_body(i, 10 + i, target="s0", state="Loading") for i in (1, 2)
    ]
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()  # the target moves: written at once
    assert executor.deployment["status"]["targetSnapshot"]["identity"] == "s0"
    executor.calls.clear()
    loop.on_pod("MODIFIED", pod_body(1, 20, snapshot="s0", target="s0", state="Ready"))
    await loop.reconcile()  # counts and messages changed only, within the interval: deferred
    assert ("deployment", "demo") not in executor.calls
    await asyncio.sleep(2.5)
    await loop.reconcile()
    assert ("deployment", "demo") in executor.calls
    assert executor.deployment["status"]["replicasByState"] == {"Loading": 1, "Ready": 2}


#: A weights digest the snapshot declares and the replicas report: believed at once.
DIGEST = "ab" * 16


def _declaring(snapshot: dict[str, Any]) -> dict[str, Any]:
    snapshot["spec"]["digest"] = DIGEST
    return snapshot


async def test_a_snapshots_progress_waits_but_failures_and_completion_do_not() -> None:
    """The ledger's progress (a replica Ready, the counts, the messages) is written at most
    once per status interval — the PolicySnapshot carries the whole ledger, and its writes
    every half second were ~19 % of the API server's CPU in a 1,000-replica rollout — while a
    replica's failure and the snapshot turning Ready are written at once.

    Would catch: every ledger change written at once, a deferred write never made, and a
    failure or a completion held back with the progress."""
    executor = RecordingExecutor(deployment_body(replicas=3), [_declaring(snapshot_body("s0", 0))])
    loop = reconciler(executor)  # status interval 2 s
    executor.pods = [pod_body(0, 10, snapshot="s0", target="s0", state="Ready", digest=DIGEST)] + [
        pod_body(i, 10 + i, target="s0", state="Loading") for i in (1, 2)
    ]
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()  # the target moves: the snapshot's record starts at once
    assert ("snapshot", "s0") in executor.calls
    executor.calls.clear()

    loop.on_pod(
        "MODIFIED", pod_body(1, 20, snapshot="s0", target="s0", state="Ready", digest=DIGEST)
    )
    await loop.reconcile()  # progress only, within the interval: waits
    assert ("snapshot", "s0") not in executor.calls
    assert executor.snapshots["s0"]["status"]["replicas"]["demo-1"]["state"] == "Loading"

    loop.on_pod("MODIFIED", pod_body(2, 21, target="s0", state="Failed", reason="EngineError"))
    await loop.reconcile()  # a failure: at once, with the progress that waited
    assert ("snapshot", "s0") in executor.calls
    ledger = executor.snapshots["s0"]["status"]["replicas"]
    assert ledger["demo-1"]["state"] == "Ready" and ledger["demo-2"]["state"] == "Failed"
    executor.calls.clear()

    loop.on_pod(
        "MODIFIED", pod_body(2, 22, snapshot="s0", target="s0", state="Ready", digest=DIGEST)
    )
    await loop.reconcile()  # every replica serves it: Ready latches, written at once
    assert ("snapshot", "s0") in executor.calls
    status = executor.snapshots["s0"]["status"]
    assert status["readyReplicas"] == 3
    assert [c["status"] for c in status["conditions"] if c["type"] == "Ready"] == ["True"]


async def test_a_waiting_progress_write_is_made_when_its_interval_passed() -> None:
    executor = RecordingExecutor(deployment_body(replicas=3), [_declaring(snapshot_body("s0", 0))])
    loop = reconciler(executor)
    executor.pods = [pod_body(0, 10, snapshot="s0", target="s0", state="Ready", digest=DIGEST)]
    executor.pods += [pod_body(i, 10 + i, target="s0", state="Loading") for i in (1, 2)]
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()
    executor.calls.clear()
    loop.on_pod(
        "MODIFIED", pod_body(1, 20, snapshot="s0", target="s0", state="Ready", digest=DIGEST)
    )
    await loop.reconcile()
    assert ("snapshot", "s0") not in executor.calls
    # Without any new report, the loop is woken when the write comes due (the status
    # interval, 2 s here): reconcile on each wake-up, as the loop does.
    for _ in range(5):
        assert await loop.wakeup.wait(5.0), "no wake-up for the waiting write"
        await loop.reconcile()
        if ("snapshot", "s0") in executor.calls:
            break
    assert ("snapshot", "s0") in executor.calls
    assert executor.snapshots["s0"]["status"]["replicas"]["demo-1"]["state"] == "Ready"


async def test_a_refused_token_makes_one_fresh_client_for_all_reconcilers() -> None:
    from hotload.operator.executor import KubeExecutor

    made: list[object] = []

    class Client:
        async def close(self) -> None:
            made.append("closed")

    async def connect() -> Any:
        made.append("new")
        return Client()

    executor = KubeExecutor(Client(), OperatorMetrics(), "op", connect)  # type: ignore[arg-type]
    await asyncio.gather(executor.reconnect(), executor.reconnect(), executor.reconnect())
    assert made == ["new", "closed"]


async def test_events_go_out_before_the_writes_that_record_what_they_announce() -> None:
    """Would catch: a leader stopped between its status write and its Event leaving the
    move unannounced for ever (its successor sees no transition to announce)."""
    executor = RecordingExecutor(deployment_body(), [snapshot_body("s0", 0)])
    loop = reconciler(executor)
    executor.pods = [pod_body(i, 10 + i, state="Loading") for i in range(2)]
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()
    moved = executor.calls.index(("event", "TargetMoved"))
    assert moved < executor.calls.index(("deployment", "demo"))


async def test_a_write_that_meets_a_newer_object_is_refused_and_planned_again() -> None:
    """Would catch: a status write planned on an old view overwriting a newer object (a
    resumed leader rewriting a finished record), or a conflict treated as an outage."""
    executor = RecordingExecutor(deployment_body(), [snapshot_body("s0", 0)])
    loop = reconciler(executor)
    executor.pods = [pod_body(i, 10 + i, snapshot="s0", target="s0", state="Ready")
                     for i in range(2)]  # fmt: skip
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()
    # Another writer changes the snapshot after our view of it (a label, say).
    executor._bump(executor.snapshots["s0"])
    loop.on_pod("MODIFIED", pod_body(1, 30, target="s0", state="Failed", reason="EngineError"))
    with pytest.raises(KubeConflict):
        await loop.reconcile()
    assert ("conflict", "s0") in executor.calls
    await loop._seed()  # what the loop does after a conflict: read afresh, plan again
    await loop.reconcile()
    assert executor.snapshots["s0"]["status"]["replicas"]["demo-1"]["state"] == "Failed"
    # Announced before the refused write, and not again when the same plan is retried.
    assert executor.calls.count(("event", "ReplicaFailed")) == 1


async def test_retention_reads_the_checkpoint_from_the_spec_and_keeps_nothing_older() -> None:
    """Would catch: the checkpoint not read from ``spec.incremental.checkpoint`` into what
    retention plans with (the old chain kept forever), or read as the floor's successor
    (``of`` deleted while a replica may still need it to go on by deltas)."""
    chain = [snapshot_body("s0", 0), snapshot_body("s1", 1, "s0"), snapshot_body("s2", 2, "s1"),
             snapshot_body("s3", 3, "s2", checkpoint_of="s1")]  # fmt: skip
    executor = RecordingExecutor(deployment_body(keep=1), chain)
    loop = reconciler(executor)
    executor.pods = [pod_body(i, 10 + i, snapshot="s3", target="s3", state="Ready")
                     for i in range(2)]  # fmt: skip
    loop.on_pod_list(executor.pods, str(executor.version))
    await loop._seed()
    await loop.reconcile()
    assert executor.deployment["status"]["targetSnapshot"]["identity"] == "s3"
    assert [c for c in executor.calls if c[0] == "delete"] == [("delete", "s0")]
    assert sorted(executor.snapshots) == ["s1", "s2", "s3"]
