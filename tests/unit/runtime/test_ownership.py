"""Which pods are the runtime's and how each container runs."""

from __future__ import annotations

from typing import Any

from hotload.api.pod import ANNOTATION_RUNTIME
from hotload.local.runtime.ownership import ContainerMode, deployment_of, is_ours, plan_containers


def _pod(*commands: list[str], shared: bool = False) -> dict[str, Any]:
    containers: list[dict[str, Any]] = [
        {"name": f"c{n}", "image": "img", "command": c} for n, c in enumerate(commands)
    ]
    for container in containers:
        if container["command"][:2] == ["hotload", "sidecar"]:
            container["env"] = [{"name": "HOTLOAD_DEPLOYMENT", "value": "fleet"}]
    metadata: dict[str, Any] = {"name": "p-0"}
    if shared:
        metadata["annotations"] = {ANNOTATION_RUNTIME: "shared"}
    return {"metadata": metadata, "spec": {"containers": containers}}


def test_a_pod_is_ours_when_one_container_runs_hotload() -> None:
    assert is_ours(_pod(["hotload", "sidecar"], ["nginx"]))
    assert not is_ours(_pod(["nginx"]))
    assert not is_ours(
        {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "a", "image": "hotload"}]}}
    )


def test_other_commands_are_planned_unsupported_with_a_message_naming_them() -> None:
    plans = plan_containers(_pod(["hotload", "sidecar"], ["nginx", "-g", "daemon off;"]))
    assert plans[0].mode is ContainerMode.PROCESS
    assert plans[1].mode is ContainerMode.UNSUPPORTED
    assert "nginx -g daemon off;" in plans[1].message


def test_shared_mode_needs_the_annotation_a_sidecar_and_a_noop_engine() -> None:
    shared = _pod(["hotload", "engine", "noop"], ["hotload", "sidecar"], shared=True)
    assert [p.mode for p in plan_containers(shared)] == [
        ContainerMode.SHARED_ENGINE,
        ContainerMode.SHARED_AGENT,
    ]
    assert deployment_of(shared) == "fleet"
    reference = _pod(["hotload", "engine", "reference"], ["hotload", "sidecar"], shared=True)
    assert {p.mode for p in plan_containers(reference)} == {ContainerMode.PROCESS}
    unannotated = _pod(["hotload", "engine", "noop"], ["hotload", "sidecar"])
    assert {p.mode for p in plan_containers(unannotated)} == {ContainerMode.PROCESS}
