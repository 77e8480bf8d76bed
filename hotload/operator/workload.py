"""Render a RolloutDeployment's Kubernetes objects: StatefulSet, Service, NetworkPolicy,
sidecar RBAC.

A pure planner (CONVENTIONS.md, "LWS / kueue"): the deployment in, plain Kubernetes objects out, no
API calls. The operator applies them; until it exists the demo and the tests do. The pod
template is the pod contract (CONTRACTS.md) and equals ``examples/pod.yaml`` for the example
deployment, which a test checks.
"""

from __future__ import annotations

from typing import Any, Final

from hotload.api import EngineKind, RolloutDeployment
from hotload.api import pod as contract
from hotload.api.group import API_VERSION
from hotload.api.labels import (
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_OPERATOR,
    NAME_LABEL,
    REPLICA_NAME,
)
from hotload.api.rollout_deployment import (
    ENGINE_ADMIN_API_KEY_SECRET_KEY,
    ENGINE_API_KEY_SECRET_KEY,
    ENV_ENGINE_ADMIN_API_KEY,
    ENV_ENGINE_API_KEY,
)

KubeObject = dict[str, Any]
"""A Kubernetes object as the API takes it (plain JSON; "manifest" in hotload means only a
snapshot's manifest)."""

TERMINATION_GRACE_SECONDS: Final = 30
SIDECAR_CLUSTER_ROLE: Final = "hotload-sidecar"
"""The ClusterRole the chart ships with ``SIDECAR_RBAC_RULES``; the operator binds each
deployment's sidecar ServiceAccount to it (holding only ``bind`` on it, never the rules)."""


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select one deployment's replica pods."""
    return {NAME_LABEL: REPLICA_NAME, INSTANCE_LABEL: name}


def pod_labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), MANAGED_BY_LABEL: MANAGED_BY_OPERATOR}


def label_selector(name: str) -> str:
    """The selector as a string, as `status.selector` and `kubectl -l` take it."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(name).items())


def sidecar_service_account(name: str) -> str:
    return f"{name}-sidecar"


def _field_env(env_name: str, field_path: str) -> KubeObject:
    return {"name": env_name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _secret_env(
    secret: str, key: str, name: str | None = None, optional: bool = True
) -> KubeObject:
    return {
        "name": name or key,
        "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}},
    }


def _staging_mount() -> list[KubeObject]:
    return [{"name": contract.STAGING_VOLUME, "mountPath": contract.STAGING_MOUNT_PATH}]


def engine_command(deployment: RolloutDeployment) -> list[str]:
    """The engine container's command for each engine kind."""
    engine = deployment.spec.engine
    port = str(engine.port)
    host = f"$({contract.ENV_ENGINE_HOST})"
    if engine.kind is EngineKind.REFERENCE:
        return ["hotload", "engine", "reference", "--host", host, "--port", port, *engine.args]
    if engine.kind is EngineKind.NOOP:
        return ["hotload", "engine", "noop", "--port", port, *engine.args]
    keys = engine.keys_secret_ref is not None
    if engine.kind is EngineKind.SGLANG:
        return [
            "python3", "-m", "sglang.launch_server",
            "--model-path", deployment.spec.model.name,
            "--served-model-name", deployment.spec.model.served_name,
            "--host", host, "--port", port,
            *(["--api-key", f"$({ENV_ENGINE_API_KEY})",
                "--admin-api-key", f"$({ENV_ENGINE_ADMIN_API_KEY})"] if keys else []),
            *engine.args,
        ]  # fmt: skip
    return [
        "vllm", "serve", deployment.spec.model.name,
        "--served-model-name", deployment.spec.model.served_name,
        "--host", host, "--port", port,
        *(["--api-key", f"$({ENV_ENGINE_API_KEY})"] if keys else []),
        *engine.args,
    ]  # fmt: skip


def engine_key_env(deployment: RolloutDeployment) -> list[KubeObject]:
    """The engine's API keys from ``spec.engine.keysSecretRef``, for the engine and the sidecar.

    Both keys are required for SGLang (its admin routes take only the admin key when both
    are set, and an unset ``$(VAR)`` would reach the command line literally); vLLM has one.
    """
    engine = deployment.spec.engine
    secret = engine.keys_secret_ref
    if secret is None or engine.kind not in (EngineKind.SGLANG, EngineKind.VLLM):
        return []
    env = [_secret_env(secret.name, ENGINE_API_KEY_SECRET_KEY, ENV_ENGINE_API_KEY, False)]
    if engine.kind is EngineKind.SGLANG:
        env.append(
            _secret_env(
                secret.name, ENGINE_ADMIN_API_KEY_SECRET_KEY, ENV_ENGINE_ADMIN_API_KEY, False
            )
        )
    return env


def _engine_host_env() -> KubeObject:
    """The engine's address, the same in both containers: the pod's loopback."""
    return {"name": contract.ENV_ENGINE_HOST, "value": contract.ENGINE_HOST}


def _engine_env(deployment: RolloutDeployment) -> list[KubeObject]:
    kind = deployment.spec.engine.kind
    env = [_engine_host_env(), *engine_key_env(deployment)]
    if kind is EngineKind.VLLM:
        # The reload, pause and version routes exist only in dev mode (engine-facts.md).
        env += [
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"},
        ]
    if kind is EngineKind.SGLANG:
        # /health runs a generation, which a pause holds for 20 s and then fails: plain,
        # it answers 200 without generating, and needs no key (docs/engines.md).
        env.append({"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "0"})
    return env


def engine_container(deployment: RolloutDeployment) -> KubeObject:
    """The engine, listening on the pod's loopback: it declares no port and has no probe of
    its own (a kubelet probes the pod's IP); the sidecar's ``/readyz`` asks its health."""
    engine = deployment.spec.engine
    container: KubeObject = {
        "name": "engine",
        "image": engine.image,
        "command": engine_command(deployment),
        "env": _engine_env(deployment),
        "volumeMounts": _staging_mount(),
    }
    if engine.resources:
        container["resources"] = engine.resources
    return container


def sidecar_container(deployment: RolloutDeployment) -> KubeObject:
    name = deployment.metadata["name"]
    env = [
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
        _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
        _field_env(contract.ENV_POD_IP, "status.podIP"),
        _field_env(contract.ENV_NODE_NAME, "spec.nodeName"),
        {"name": contract.ENV_DEPLOYMENT, "value": name},
        _engine_host_env(),
    ]
    secret = deployment.spec.hot_load.credentials_secret_ref
    if secret is not None:
        env += [
            _secret_env(secret.name, "AWS_ACCESS_KEY_ID"),
            _secret_env(secret.name, "AWS_SECRET_ACCESS_KEY"),
        ]
    env += engine_key_env(deployment)
    container: KubeObject = {
        "name": "sidecar",
        "image": deployment.spec.sidecar.image,
        "command": ["hotload", "sidecar"],
        "ports": [{"name": "http", "containerPort": contract.SIDECAR_PORT}],
        "env": env,
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": contract.SIDECAR_PORT},
            "periodSeconds": 2,
        },
        # A sidecar restart drops its in-memory view (what it patched into the engine,
        # which buffer lags): kill it only when it is gone, not when a busy node answers
        # late (the default timeout is 1 s).
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": contract.SIDECAR_PORT},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "volumeMounts": _staging_mount(),
    }
    if deployment.spec.sidecar.resources:
        container["resources"] = deployment.spec.sidecar.resources
    return container


def pod_template(deployment: RolloutDeployment) -> KubeObject:
    """The replica pod (metadata without a name: the StatefulSet names each pod)."""
    name = deployment.metadata["name"]
    scheduling = deployment.spec.scheduling
    spec: KubeObject = {
        "serviceAccountName": sidecar_service_account(name),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "readinessGates": [{"conditionType": contract.CONDITION_SNAPSHOT_READY}],
    }
    if scheduling.node_selector:
        spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        spec["tolerations"] = list(scheduling.tolerations)
    if scheduling.affinity:
        spec["affinity"] = dict(scheduling.affinity)
    spec["volumes"] = [{"name": contract.STAGING_VOLUME, "emptyDir": {"medium": "Memory"}}]
    spec["containers"] = [engine_container(deployment), sidecar_container(deployment)]
    metadata: KubeObject = {"labels": pod_labels(name)}
    if deployment.spec.engine.kind is EngineKind.NOOP:
        metadata["annotations"] = {contract.ANNOTATION_RUNTIME: contract.RUNTIME_SHARED}
    return {"metadata": metadata, "spec": spec}


def _metadata(deployment: RolloutDeployment, name: str) -> KubeObject:
    metadata: KubeObject = {"name": name, "labels": pod_labels(deployment.metadata["name"])}
    namespace = deployment.metadata.get("namespace")
    if namespace:
        metadata["namespace"] = namespace
    uid = deployment.metadata.get("uid")
    if uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": deployment.kind,
                "name": deployment.metadata["name"],
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return metadata


def _owned(
    deployment: RolloutDeployment, api_version: str, kind: str, spec: KubeObject
) -> KubeObject:
    """An object named after the deployment and owned by it."""
    metadata = _metadata(deployment, deployment.metadata["name"])
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}


def stateful_set(deployment: RolloutDeployment) -> KubeObject:
    name = deployment.metadata["name"]
    return _owned(
        deployment,
        "apps/v1",
        "StatefulSet",
        {
            "replicas": deployment.spec.replicas,
            "serviceName": name,
            # Replicas are interchangeable: start and stop them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(name)},
            "template": pod_template(deployment),
        },
    )


def service(deployment: RolloutDeployment) -> KubeObject:
    """The inference front of the region: the sidecars' OpenAI-compatible port, and no other
    (the engine's port is the pod's own)."""
    spec = {
        "selector": selector_labels(deployment.metadata["name"]),
        "ports": [{"name": "http", "port": contract.SIDECAR_PORT, "targetPort": "http"}],
    }
    return _owned(deployment, "v1", "Service", spec)


def network_policy(deployment: RolloutDeployment) -> KubeObject:
    """Ingress to the replicas on the front's port only (docs/security.md).

    The engine listens on the pod's loopback already; this keeps it so where a
    ``spec.engine.args`` or an engine's own default binds it wider, and closes every other
    port the pod's containers might open. Egress is left open: the sidecar reads its bucket
    and the API server, wherever those are.
    """
    spec = {
        "podSelector": {"matchLabels": selector_labels(deployment.metadata["name"])},
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": contract.SIDECAR_PORT}]}],
    }
    return _owned(deployment, "networking.k8s.io/v1", "NetworkPolicy", spec)


def sidecar_rbac(
    deployment: RolloutDeployment, cluster_role: str | None = None
) -> list[KubeObject]:
    """The sidecar's ServiceAccount and its RoleBinding, and the Role when no ClusterRole is named.

    The operator binds to the chart's ClusterRole (``cluster_role``), so it needs ``bind``
    on that one role instead of holding the sidecar's rules itself; tests that apply a
    workload by hand in a region without the chart get a Role with the same rules.
    """
    account = sidecar_service_account(deployment.metadata["name"])
    namespace = deployment.metadata.get("namespace")
    subject: KubeObject = {"kind": "ServiceAccount", "name": account}
    if namespace:
        subject["namespace"] = namespace
    objects: list[KubeObject] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(deployment, account)}
    ]
    if cluster_role is None:
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": _metadata(deployment, account),
                "rules": [dict(rule) for rule in contract.SIDECAR_RBAC_RULES],
            }
        )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(deployment, account),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole" if cluster_role else "Role",
                "name": cluster_role or account,
            },
            "subjects": [subject],
        }
    )
    return objects


def render_workload(
    deployment: RolloutDeployment, cluster_role: str | None = None
) -> list[KubeObject]:
    """Every object a deployment needs, in apply order (RBAC and the network policy first,
    pods last)."""
    return [
        *sidecar_rbac(deployment, cluster_role),
        network_policy(deployment),
        service(deployment),
        stateful_set(deployment),
    ]
