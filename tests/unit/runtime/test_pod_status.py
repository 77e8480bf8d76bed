"""The runtime's part of pod status: phase, Ready with readiness gates, patch shape."""

from __future__ import annotations

from typing import Any

from hotload.api.pod import CONDITION_SNAPSHOT_READY
from hotload.local.runtime.container import ContainerView, waiting_view
from hotload.local.runtime.pod_status import OWN_CONDITIONS, is_ready, pod_phase, status_patch

RUNNING = {"running": {"startedAt": "2026-11-23T10:00:00Z"}}


def _view(
    name: str, *, ready: bool = True, state: dict[str, Any] | None = None, **kw: Any
) -> ContainerView:
    return ContainerView(name, "img", state or RUNNING, ready=ready, started=True, **kw)


def _pod(*, gate_status: str | None = None, gated: bool = True) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True"}]
    if gate_status is not None:
        conditions.append({"type": CONDITION_SNAPSHOT_READY, "status": gate_status})
    spec: dict[str, Any] = {"restartPolicy": "Always"}
    if gated:
        spec["readinessGates"] = [{"conditionType": CONDITION_SNAPSHOT_READY}]
    return {
        "metadata": {"name": "p", "generation": 1},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def _conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["status"]["conditions"]}


def _patch(pod: dict[str, Any], views: list[ContainerView], **kw: Any) -> dict[str, Any]:
    return status_patch(
        pod, views, pod_ip="127.9.1.1", host_ip="127.0.0.1", start_time="t0", now="t1", **kw
    )


def test_ready_needs_every_container_ready_and_every_gate_true() -> None:
    views = [_view("engine"), _view("sidecar")]
    assert not is_ready(_pod(), views), "no gate condition yet"
    assert not is_ready(_pod(gate_status="False"), views)
    assert is_ready(_pod(gate_status="True"), views)
    assert not is_ready(_pod(gate_status="True"), [_view("engine"), _view("sidecar", ready=False)])
    assert is_ready(_pod(gated=False), views)


def test_patch_names_only_the_runtimes_conditions_never_the_gate() -> None:
    body = _patch(_pod(gate_status="True"), [_view("sidecar")])
    kinds = [c["type"] for c in body["status"]["conditions"]]
    assert sorted(kinds) == sorted(OWN_CONDITIONS)
    assert CONDITION_SNAPSHOT_READY not in kinds
    assert _conditions(body)["Ready"]["status"] == "True"
    assert body["status"]["podIP"] == "127.9.1.1"
    assert body["status"]["observedGeneration"] == 1


def test_not_ready_reasons_say_which_container_or_gate_is_missing() -> None:
    body = _patch(_pod(), [_view("engine", ready=False), _view("sidecar")])
    ready = _conditions(body)["Ready"]
    assert ready["reason"] == "ContainersNotReady"
    assert "engine" in ready["message"]
    body = _patch(_pod(), [_view("engine"), _view("sidecar")])
    ready = _conditions(body)["Ready"]
    assert ready["reason"] == "ReadinessGatesNotReady"
    assert CONDITION_SNAPSHOT_READY in ready["message"]


def test_a_true_condition_clears_its_stale_reason_in_the_merge() -> None:
    body = _patch(_pod(gate_status="True"), [_view("sidecar")])
    ready = _conditions(body)["Ready"]
    assert ready["reason"] is None and ready["message"] is None


def test_transition_time_moves_only_when_status_changes() -> None:
    pod = _pod()
    first = _patch(pod, [_view("sidecar", ready=False)])
    written = {c["type"]: c for c in first["status"]["conditions"]}
    again = status_patch(
        pod,
        [_view("sidecar", ready=False)],
        pod_ip="127.9.1.1",
        host_ip="127.0.0.1",
        start_time="t0",
        now="t2",
        written=written,
    )
    assert _conditions(again)["Ready"]["lastTransitionTime"] == "t1"
    flipped = status_patch(
        _pod(gate_status="True"),
        [_view("sidecar")],
        pod_ip="127.9.1.1",
        host_ip="127.0.0.1",
        start_time="t0",
        now="t3",
        written=written,
    )
    assert _conditions(flipped)["Ready"]["lastTransitionTime"] == "t3"


def test_pod_ips_replace_rather_than_append() -> None:
    body = _patch(_pod(), [_view("sidecar")])
    assert {"$patch": "replace"} in body["status"]["podIPs"]


def test_phase_follows_the_kubelet_rules() -> None:
    waiting = waiting_view("x", "img", "UnsupportedCommand", "")
    crashed = ContainerView(
        "c",
        "img",
        {"waiting": {"reason": "CrashLoopBackOff"}},
        last_state={"terminated": {"exitCode": 1}},
        terminated_code=1,
    )
    done_ok = ContainerView("c", "img", {"terminated": {"exitCode": 0}}, terminated_code=0)
    done_bad = ContainerView("c", "img", {"terminated": {"exitCode": 2}}, terminated_code=2)
    assert pod_phase([_view("a"), waiting], "Always", None) == "Pending"
    assert pod_phase([_view("a")], "Always", None) == "Running"
    assert pod_phase([crashed], "Always", "Running") == "Running"
    assert pod_phase([done_ok], "Never", "Running") == "Succeeded"
    assert pod_phase([done_bad], "Never", "Running") == "Failed"
    assert pod_phase([done_bad], "OnFailure", "Running") == "Running"
    assert pod_phase([_view("a")], "Always", "Succeeded") == "Succeeded", "terminal stays"


def _applied(pod: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The pod as the server holds it after the patch (conditions merged by type)."""
    import copy

    status = copy.deepcopy(pod["status"])
    wanted = copy.deepcopy(body["status"])
    for key, value in wanted.items():
        if key == "conditions":
            merged = {c["type"]: c for c in status.get("conditions", [])}
            merged.update({c["type"]: dict(c) for c in value})
            status["conditions"] = list(merged.values())
        elif isinstance(value, list):
            status[key] = [v for v in value if "$patch" not in v]
        else:
            status[key] = value
    return {**pod, "status": status}


def test_the_runtime_sees_a_foreign_change_to_its_conditions() -> None:
    from hotload.local.runtime.pod_status import status_differs

    pod = _pod(gate_status="True")
    body = _patch(pod, [_view("engine"), _view("sidecar")])
    held = _applied(pod, body)
    assert not status_differs(held, body), "what we wrote is what the server holds"
    # The controller-manager marks the pod unready while the node lease lapsed.
    for condition in held["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition.update(status="False", reason="NodeNotReady")
    assert status_differs(held, body)


def test_fields_the_server_adds_or_times_it_keeps_are_no_difference() -> None:
    from hotload.local.runtime.pod_status import status_differs

    pod = _pod(gate_status="True")
    body = _patch(pod, [_view("sidecar")])
    held = _applied(pod, body)
    held["status"]["qosClass"] = "BestEffort"
    held["status"]["containerStatuses"][0]["imageID"] = ""
    for condition in held["status"]["conditions"]:
        condition["lastTransitionTime"] = "2026-11-23T09:00:00Z"
    assert not status_differs(held, body)
    held["status"]["containerStatuses"][0]["restartCount"] = 7
    assert status_differs(held, body)
