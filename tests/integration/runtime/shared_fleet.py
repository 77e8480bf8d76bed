"""A deployment of shared-mode replicas, installed the way the operator will install it.

Tests of the runtime's shared mode and the scale benchmark need the same thing: a
RolloutDeployment with the ``noop`` engine (whose pods the workload renderer marks
``hotload.dev/runtime: shared``), the sidecar's ServiceAccount, Role and RoleBinding, and
replica pods. Everything here comes from :mod:`hotload.operator.workload`, so these runs
also prove that what the operator renders runs under the local runtime with the RBAC
it grants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from hotload.api import API_VERSION, RolloutDeployment
from hotload.operator.workload import pod_template, sidecar_rbac, stateful_set

KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def install_shared_deployment(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    *,
    bucket: Path,
    replicas: int,
    target: dict[str, Any] | None = None,
) -> RolloutDeployment:
    """Create the RolloutDeployment (and its target, when given) and the sidecar RBAC."""
    group, version = API_VERSION.split("/")
    custom = k8s.CustomObjectsApi(api)
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "RolloutDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "tiny", "servedName": "policy"},
            "engine": {"kind": "noop", "port": 8000},
            "replicas": replicas,
            "hotLoad": {"bucketUrl": f"file://{bucket}", "transition": "ASYNC"},
            "scheduling": {"tolerations": [KWOK_TOLERATION]},
        },
    }
    plural = "rolloutdeployments"
    custom.create_namespaced_custom_object(group, version, namespace, plural, manifest)
    if target is not None:
        custom.patch_namespaced_custom_object_status(
            group, version, namespace, plural, name,
            {"status": {"targetSnapshot": target}},
        )  # fmt: skip
    deployment = RolloutDeployment.model_validate(
        custom.get_namespaced_custom_object(group, version, namespace, plural, name)
    )
    for document in sidecar_rbac(deployment):
        k8s_utils.create_from_dict(api, document, namespace=namespace)
    return deployment


def shared_pod(deployment: RolloutDeployment, name: str) -> dict[str, Any]:
    """One replica pod as the StatefulSet would create it, under a name of our choosing."""
    template = pod_template(deployment)
    return {**template, "metadata": {**template["metadata"], "name": name}}


def create_stateful_set(api: k8s.ApiClient, namespace: str, deployment: RolloutDeployment) -> None:
    k8s_utils.create_from_dict(api, stateful_set(deployment), namespace=namespace)
