"""Status on a real kube-apiserver: a Ready condition written to the status subresource
satisfies ``kubectl wait``, and the pydantic models round-trip what the server returns."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s

from hotload.api import (
    GROUP,
    VERSION,
    LoadPath,
    PolicySnapshot,
    PolicySnapshotStatus,
    ReplicaRecord,
    ReplicaState,
    RolloutDeployment,
    RolloutDeploymentStatus,
    SnapshotPhase,
    SnapshotRef,
    conditions,
    reasons,
    set_condition,
)
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from tests.fixtures.cluster import Kubectl, KubectlFailed

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MOMENT = datetime(2026, 11, 23, 9, 45, tzinfo=UTC)


def _objects(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def _get(api: k8s.ApiClient, namespace: str, plural: str, name: str) -> dict[str, Any]:
    found = _objects(api).get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    return cast(dict[str, Any], found)


def _lost_or_changed(served: Any, rendered: Any, path: str = "") -> list[str]:
    """Paths of values the server holds that ``rendered`` drops or changes."""
    if isinstance(served, dict) and isinstance(rendered, dict):
        return [
            problem
            for key, value in served.items()
            for problem in (
                _lost_or_changed(value, rendered[key], f"{path}.{key}")
                if key in rendered
                else [f"{path}.{key} (lost)"]
            )
        ]
    return [] if served == rendered else [f"{path}: {served!r} != {rendered!r}"]


def _snapshot_status() -> PolicySnapshotStatus:
    ready = set_condition([], conditions.READY, True, reasons.ROLLED, "2/2 replicas", now=MOMENT)
    chain = set_condition(ready, conditions.CHAIN_VALID, True, reasons.VERIFIED, now=MOMENT)
    return PolicySnapshotStatus(
        observed_generation=1,
        phase=SnapshotPhase.READY,
        desired_replicas=2,
        ready_replicas=2,
        replicas_summary="2/2",
        replicas={
            "demo-0": ReplicaRecord(
                state=ReplicaState.READY, snapshot="demo-step-0", since=MOMENT, via=LoadPath.FULL
            ),
            "demo-1": ReplicaRecord(
                state=ReplicaState.READY, snapshot="demo-step-0", since=MOMENT, via=LoadPath.FULL
            ),
        },
        conditions=chain,
    )


def test_ready_condition_on_status_subresource_satisfies_kubectl_wait(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "policysnapshot-full.yaml"))
    with pytest.raises(KubectlFailed):  # not Ready yet: the wait can fail
        kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", "psnap/demo-step-0", "--timeout=1s"
        )

    status = _snapshot_status().to_k8s()
    kubectl(
        "patch", "-n", namespace, "psnap/demo-step-0", "--subresource=status", "--type=merge",
        "-p", yaml.safe_dump({"status": status}),
    )  # fmt: skip
    waited = kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "psnap/demo-step-0", "--timeout=30s"
    )
    assert "condition met" in waited
    row = kubectl("get", "-n", namespace, "psnap/demo-step-0", "--no-headers").split()
    assert row[4:6] == ["2/2", "Ready"]


def test_status_written_to_the_main_resource_is_ignored(kubectl: Kubectl, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "policysnapshot-full.yaml"))
    kubectl(
        "patch", "-n", namespace, "psnap/demo-step-0", "--type=merge",
        "-p", '{"status": {"phase": "Ready"}}',
    )  # fmt: skip
    phase = kubectl("get", "-n", namespace, "psnap/demo-step-0", "-o", "jsonpath={.status.phase}")
    assert phase == ""


def test_policy_snapshot_model_round_trips_the_server_object(
    kubectl: Kubectl, kube_clients: dict[str, k8s.ApiClient], namespace: str
) -> None:
    api = kube_clients["region-1"]
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "policysnapshot-incremental.yaml"))
    sent = _snapshot_status()
    _objects(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, SNAPSHOTS, "demo-step-1", {"status": sent.to_k8s()}
    )
    served = _get(api, namespace, SNAPSHOTS, "demo-step-1")

    model = PolicySnapshot.model_validate(served)
    assert model.status == sent
    assert model.spec.incremental is not None
    assert model.spec.incremental.previous_identity == "demo-step-0"
    rendered = model.to_k8s()
    assert rendered["spec"] == served["spec"]
    assert rendered["status"] == served["status"]

    # And back: the server accepts the model's rendering unchanged (spec is immutable, so a
    # difference in spec would be refused; status comes back equal).
    replaced = cast(
        dict[str, Any],
        _objects(api).replace_namespaced_custom_object(
            GROUP, VERSION, namespace, SNAPSHOTS, "demo-step-1", rendered
        ),
    )
    assert replaced["metadata"]["generation"] == served["metadata"]["generation"]
    assert PolicySnapshot.model_validate(replaced) == model


def test_rollout_deployment_model_round_trips_the_server_object(
    kubectl: Kubectl, kube_clients: dict[str, k8s.ApiClient], namespace: str
) -> None:
    api = kube_clients["region-2"]
    kubectl(
        "apply", "-n", namespace, "-f", str(EXAMPLES / "rolloutdeployment.yaml"), context="region-2"
    )
    target = SnapshotRef(identity="demo-step-1", step=1, kind="Incremental", kv_cache_policy="all")
    sent = RolloutDeploymentStatus(
        observed_generation=1,
        target_snapshot=target,
        current_snapshot=target,
        replicas=2,
        ready_replicas=2,
        updated_replicas=2,
        selector="app.kubernetes.io/instance=demo",
        replicas_by_state={"Ready": 2},
        replicas_by_snapshot={"demo-step-1": 2},
        conditions=set_condition([], conditions.AVAILABLE, True, reasons.ROLLED, now=MOMENT),
    )
    _objects(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, DEPLOYMENTS, "demo", {"status": sent.to_k8s()}
    )
    served = _get(api, namespace, DEPLOYMENTS, "demo")

    row = kubectl("get", "-n", namespace, "rd/demo", "--no-headers", context="region-2").split()
    assert row[:5] == ["demo", "2", "2", "demo-step-1", "demo-step-1"]
    kubectl(
        "wait", "-n", namespace, "--for=condition=Available", "rd/demo", "--timeout=30s",
        context="region-2",
    )  # fmt: skip

    model = RolloutDeployment.model_validate(served)
    assert model.status == sent
    rendered = model.to_k8s()
    # The model fills its defaults (sidecar image, empty scheduling maps) that the server
    # does not store; everything the server holds comes back unchanged.
    assert _lost_or_changed(served["spec"], rendered["spec"]) == []
    assert rendered["status"] == served["status"]
    replaced = _objects(api).replace_namespaced_custom_object(
        GROUP, VERSION, namespace, DEPLOYMENTS, "demo", rendered
    )
    again = RolloutDeployment.model_validate(replaced)
    assert (again.spec, again.status) == (model.spec, model.status)
