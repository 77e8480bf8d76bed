"""Our kwok Stages: pods of ours are the runtime's, readiness gates are their owners'."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hotload.local.control_plane import kwok_stages_text

OURS = {"key": ".spec.containers.[].command.[0]", "operator": "NotIn", "values": ["hotload"]}


@pytest.fixture(scope="module")
def stages() -> dict[str, dict[str, Any]]:
    documents = [doc for doc in yaml.safe_load_all(kwok_stages_text()) if doc]
    assert all(doc["kind"] == "Stage" for doc in documents)
    return {doc["metadata"]["name"]: doc for doc in documents}


def test_node_and_pod_stages_are_all_there(stages: dict[str, dict[str, Any]]) -> None:
    assert set(stages) == {
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-complete",
        "pod-delete",
    }


@pytest.mark.parametrize("name", ["pod-ready", "pod-complete", "pod-delete"])
def test_every_pod_stage_skips_pods_with_a_hotload_container(
    stages: dict[str, dict[str, Any]], name: str
) -> None:
    stage = stages[name]
    assert stage["spec"]["resourceRef"]["kind"] == "Pod"
    assert OURS in stage["spec"]["selector"]["matchExpressions"]


def test_node_stages_manage_every_fake_node(stages: dict[str, dict[str, Any]]) -> None:
    for name in ("node-initialize", "node-heartbeat-with-lease"):
        expressions = stages[name]["spec"]["selector"]["matchExpressions"]
        assert OURS not in expressions


def test_pod_ready_never_sets_readiness_gate_conditions(stages: dict[str, dict[str, Any]]) -> None:
    template = stages["pod-ready"]["spec"]["next"]["statusTemplate"]
    assert "range .spec.readinessGates" not in template
    assert "ReadinessGatesNotReady" in template
    assert "phase: Running" in template
