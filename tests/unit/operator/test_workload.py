"""The rendered replica pod is the pod contract: examples/pod.yaml, field for field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hotload.api import EngineKind, RolloutDeployment
from hotload.api import pod as contract
from hotload.engines.sglang_adapter import SGLangEngine
from hotload.operator.workload import (
    engine_command,
    label_selector,
    network_policy,
    pod_template,
    render_workload,
    selector_labels,
    service,
    stateful_set,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _example_deployment(**hot_load: Any) -> RolloutDeployment:
    document = yaml.safe_load((EXAMPLES / "rolloutdeployment.yaml").read_text())
    document["spec"]["hotLoad"].update(hot_load)
    return RolloutDeployment.model_validate(document)


def test_rendered_pod_equals_the_reference_pod() -> None:
    deployment = _example_deployment(
        bucketUrl="s3://policies/demo", credentialsSecretRef={"name": "demo-bucket"}
    )
    reference = yaml.safe_load((EXAMPLES / "pod.yaml").read_text())
    rendered = pod_template(deployment)
    assert rendered["spec"] == reference["spec"]
    assert rendered["metadata"]["labels"] == reference["metadata"]["labels"]


def test_file_buckets_get_no_credentials_env() -> None:
    sidecar = pod_template(_example_deployment())["spec"]["containers"][1]
    assert not any(e["name"].startswith("AWS_") for e in sidecar["env"])


def test_noop_replicas_ask_for_the_shared_runtime() -> None:
    deployment = _example_deployment()
    deployment.spec.engine.kind = EngineKind.NOOP
    metadata = pod_template(deployment)["metadata"]
    assert metadata["annotations"] == {contract.ANNOTATION_RUNTIME: contract.RUNTIME_SHARED}
    assert engine_command(deployment)[:3] == ["hotload", "engine", "noop"]


def test_vllm_gets_its_dev_mode_routes_and_binds_the_pods_loopback() -> None:
    deployment = _example_deployment()
    deployment.spec.engine.kind = EngineKind.VLLM
    engine = pod_template(deployment)["spec"]["containers"][0]
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in engine["env"]
    host = engine["command"].index("--host") + 1
    assert engine["command"][host] == "$(HOTLOAD_ENGINE_HOST)"


@pytest.mark.parametrize("kind", [EngineKind.REFERENCE, EngineKind.SGLANG, EngineKind.VLLM])
def test_the_engine_listens_inside_its_pod_and_the_front_is_the_one_port(
    kind: EngineKind,
) -> None:
    """Issue 22: the engines' admin ports were reachable from any pod. The engine binds the
    pod's loopback (both containers agree on it), declares no port and has no probe a
    kubelet would send to the pod IP; the Service and the NetworkPolicy name only 8480."""
    deployment = _example_deployment()
    deployment.spec.engine.kind = kind
    deployment.spec.engine.keys_secret_ref = None
    engine, sidecar = pod_template(deployment)["spec"]["containers"]
    loopback = {"name": contract.ENV_ENGINE_HOST, "value": contract.ENGINE_HOST}

    assert contract.ENGINE_HOST == "127.0.0.1"
    assert loopback in engine["env"] and loopback in sidecar["env"]
    assert engine["command"][engine["command"].index("--host") + 1] == "$(HOTLOAD_ENGINE_HOST)"
    assert not {"ports", "readinessProbe", "livenessProbe", "startupProbe"} & set(engine)
    assert sidecar["ports"] == [{"name": "http", "containerPort": contract.SIDECAR_PORT}]
    assert [p["port"] for p in service(deployment)["spec"]["ports"]] == [contract.SIDECAR_PORT]
    policy = network_policy(deployment)["spec"]
    assert policy["podSelector"] == {"matchLabels": selector_labels("demo")}
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": contract.SIDECAR_PORT}]}]


def test_workload_is_rbac_then_service_then_statefulset_with_owner_refs() -> None:
    deployment = _example_deployment()
    deployment.metadata.update(namespace="team-a", uid="1234")
    kinds = [o["kind"] for o in render_workload(deployment)]
    assert kinds == [
        "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "Service", "StatefulSet"
    ]  # fmt: skip
    sts = stateful_set(deployment)
    assert sts["metadata"]["ownerReferences"][0]["uid"] == "1234"
    assert sts["spec"]["replicas"] == 2
    assert label_selector("demo") == (
        "app.kubernetes.io/name=hotload-replica,app.kubernetes.io/instance=demo"
    )


def test_sglang_is_checked_on_a_health_that_neither_generates_nor_fails_while_paused() -> None:
    """The sidecar's /readyz asks the adapter's health: SGLang's /ready answers 503 for the
    whole of a pause (0.5.23 http_server.py:714-718), /ping does not (2190-2199); /health
    with generation off answers 200 without one for anything else (745-749)."""
    deployment = _example_deployment()
    deployment.spec.engine.kind = EngineKind.SGLANG
    engine = pod_template(deployment)["spec"]["containers"][0]
    assert SGLangEngine.health_path == "/ping", "the sidecar's /readyz asks this"
    assert {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "0"} in engine["env"]


def test_engine_keys_reach_the_engine_command_and_both_containers() -> None:
    from hotload.api.rollout_deployment import SecretRef

    deployment = _example_deployment()
    deployment.spec.engine.kind = EngineKind.SGLANG
    deployment.spec.engine.keys_secret_ref = SecretRef(name="engine-keys")
    engine, sidecar = pod_template(deployment)["spec"]["containers"]
    command = engine["command"]
    assert command[command.index("--api-key") + 1] == "$(HOTLOAD_ENGINE_API_KEY)"
    assert command[command.index("--admin-api-key") + 1] == "$(HOTLOAD_ENGINE_ADMIN_API_KEY)"
    for container in (engine, sidecar):
        refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in container["env"]
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        assert refs["HOTLOAD_ENGINE_API_KEY"] == {
            "name": "engine-keys", "key": "api-key", "optional": False,
        }  # fmt: skip
        assert refs["HOTLOAD_ENGINE_ADMIN_API_KEY"]["key"] == "admin-api-key"
    deployment.spec.engine.kind = EngineKind.VLLM
    engine, _ = pod_template(deployment)["spec"]["containers"]
    assert "--admin-api-key" not in engine["command"] and "--api-key" in engine["command"]
    assert not any(e["name"] == "HOTLOAD_ENGINE_ADMIN_API_KEY" for e in engine["env"])


def test_the_sidecar_is_killed_only_when_gone_not_when_a_busy_node_answers_late() -> None:
    """A restarted sidecar forgets which buffer lags the engine: its liveness probe waits
    seconds per answer and a minute of silence, not the defaults' 1 s and 30 s."""
    sidecar = pod_template(_example_deployment())["spec"]["containers"][1]
    probe = sidecar["livenessProbe"]
    assert probe["timeoutSeconds"] >= 5
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 60
