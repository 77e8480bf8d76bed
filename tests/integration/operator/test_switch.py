"""The coordinated switch through the chart's operator on a real apiserver: the publisher's
decision (PolicySnapshot annotations) copied into the target by fenced status writes, the
deadline's presumption, an abort going back. No replicas: the sidecars' side is the
sidecar's staged swap's to test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hotload.api.labels import SWITCH_AT_ANNOTATION, SWITCH_BY_ANNOTATION
from hotload.api.switch import parse_switch_time, switch_time
from tests.integration.operator.conftest import Rollout


def _publish(rollout: Rollout, step: int, deadline: datetime, *, full: bool = False) -> str:
    snapshot = rollout.prepare(step, full=full)
    body: dict[str, Any] = snapshot.policy_snapshot(rollout.name)
    body["metadata"]["annotations"] = {SWITCH_BY_ANNOTATION: switch_time(deadline)}
    rollout.apply(body)
    return snapshot.identity


def _target(rollout: Rollout) -> dict[str, Any]:
    return dict((rollout.deployment().get("status") or {}).get("targetSnapshot") or {})


def _switch(rollout: Rollout, identity: str) -> dict[str, Any]:
    return dict((rollout.snapshot(identity).get("status") or {}).get("switch") or {})


def test_a_commit_reaches_the_target_an_undecided_switch_is_aborted_at_its_deadline(
    rollout: Rollout,
) -> None:
    """Would catch: a commit not copied into status.targetSnapshot.switchAt (or copied
    without the fence), a deadline never acted on (replicas waiting forever), an abort that
    leaves the target on a snapshot nobody will switch to, a late commit ignored."""
    rollout.create(0, rollout={"switch": "Coordinated", "onStagingTimeout": "Abort",
                               "stagingTimeoutSeconds": 60, "leadMilliseconds": 500})  # fmt: skip
    s0 = _publish(rollout, 0, datetime.now(UTC) + timedelta(hours=1), full=True)
    rollout.wait_for("s0 targeted, staging", lambda: _target(rollout).get("identity") == s0)
    assert "switchAt" not in _target(rollout) and "switchBy" not in _target(rollout)
    rollout.wait_for("s0's switch record", lambda: _switch(rollout, s0).get("decision"))
    assert _switch(rollout, s0)["decision"] == "Staging"

    # The publisher commits.
    at = datetime.now(UTC) + timedelta(seconds=2)
    rollout.run("annotate", "psnap", s0, f"{SWITCH_AT_ANNOTATION}={switch_time(at)}")
    rollout.wait_for("switchAt on the target", lambda: "switchAt" in _target(rollout))
    assert parse_switch_time(_target(rollout)["switchAt"]) == at.replace(
        microsecond=at.microsecond // 1000 * 1000
    )
    status = rollout.deployment()["status"]
    assert status.get("fence"), "the operator's write carries its Lease's fence token"
    rollout.wait_for("s0 Committed", lambda: _switch(rollout, s0).get("decision") == "Committed")
    assert any(e["reason"] == "SwitchScheduled" for e in rollout.events(rollout.name))

    # The next switch stays undecided past its deadline: with Abort, the target goes back.
    s1 = _publish(rollout, 1, datetime.now(UTC) + timedelta(seconds=4))
    rollout.wait_for("s1 targeted", lambda: _target(rollout).get("identity") == s1)
    rollout.wait_for("back to s0 at the deadline", lambda: _target(rollout).get("identity") == s0,
                     timeout_s=60)  # fmt: skip
    rollback = rollout.deployment()["status"]["rollback"]
    assert (rollback["fromIdentity"], rollback["toIdentity"]) == (s1, s0)
    # (With no replicas s1 latched Ready, so sealed, as soon as it was the target: its
    # record is not rewritten; the ledger's side is the end-to-end test's.)
    assert any(e["reason"] == "SwitchAborted" for e in rollout.events(rollout.name))

    # A commit that reaches the region late still wins: some region may have switched on it.
    late = datetime.now(UTC)
    rollout.run("annotate", "psnap", s1, f"{SWITCH_AT_ANNOTATION}={switch_time(late)}")
    rollout.wait_for("s1 targeted again, switching at once",
                     lambda: _target(rollout).get("identity") == s1)  # fmt: skip
    assert "switchAt" in _target(rollout)
    assert rollout.deployment()["status"].get("rollback") is None
