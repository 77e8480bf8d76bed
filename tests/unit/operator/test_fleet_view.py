"""``hotload status`` / ``hotload ledger`` rows: what needs a human comes first."""

from __future__ import annotations

from typing import Any

from hotload.cli.fleet_view import (
    RegionObjects,
    deployment_rows,
    replica_rows,
    snapshot_ledger_rows,
)


def rd(name: str, *, degraded: str = "False", updated: int = 2, target_step: int = 3) -> Any:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"replicas": 2},
        "status": {
            "readyReplicas": 2,
            "updatedReplicas": updated,
            "targetSnapshot": {"identity": f"s{target_step}", "step": target_step},
            "conditions": [
                {"type": "Degraded", "status": degraded, "reason": "DecodeFailed", "message": "m"}
            ],
        },
    }


def psnap(name: str, step: int, ledger: dict[str, Any] | None = None) -> Any:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"step": step, "deploymentRef": {"name": "a"}},
        "status": {"replicas": ledger or {}},
    }


def replica(name: str, snapshot: str | None, state: str, **extra: str) -> Any:
    notes = {"hotload.dev/state": state, **{f"hotload.dev/{k}": v for k, v in extra.items()}}
    if snapshot:
        notes["hotload.dev/snapshot"] = snapshot
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"app.kubernetes.io/instance": "a"},
            "annotations": notes,
        }
    }


def test_degraded_then_lagging_deployments_come_first() -> None:
    objects = RegionObjects(
        "r1", [rd("fine"), rd("lagging", updated=1), rd("broken", degraded="True")], [], []
    )
    rows = deployment_rows(objects)
    assert [r.deployment for r in rows] == ["broken", "lagging", "fine"]
    assert rows[0].degraded_reason == "DecodeFailed" and rows[0].message == "m"


def test_failed_then_most_behind_replicas_come_first_with_their_lag() -> None:
    objects = RegionObjects(
        "r1",
        [rd("a", target_step=3)],
        [psnap("s1", 1), psnap("s2", 2), psnap("s3", 3)],
        [
            replica("a-0", "s3", "Ready"),
            replica("a-1", "s2", "Loading"),
            replica("a-2", "s1", "Loading"),
            replica("a-3", "s2", "Failed", reason="EngineRejected", message="no"),
        ],
    )
    rows = replica_rows(objects)
    assert [(r.pod, r.behind) for r in rows] == [("a-3", 1), ("a-2", 2), ("a-1", 1), ("a-0", 0)]
    assert rows[0].reason == "EngineRejected"
    assert replica_rows(objects, deployment="other") == []


def test_a_snapshots_recorded_ledger_is_printed_as_rows() -> None:
    ledger = {
        "a-0": {"state": "Ready", "snapshot": "s2", "via": "delta"},
        "a-1": {"state": "Failed", "reason": "ChecksumMismatch"},
    }
    rows = snapshot_ledger_rows(RegionObjects("r1", [], [psnap("s2", 2, ledger)], []), "s2")
    assert [(r.pod, r.state) for r in rows] == [("a-1", "Failed"), ("a-0", "Ready")]
