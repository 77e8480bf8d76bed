"""helm install, upgrade and uninstall of the chart behave as users expect, with the real helm
against a real apiserver and the operator's pods run by the pod runtime.

A second, small release (one operator replica watching only its own namespace, so its rights
are Roles there; no sidecar ClusterRole: the session's release owns that one) goes through
its whole life in one region. It would catch Roles that grant too little or leak outside the
watched namespace, an upgrade that does not roll the operator, a release that leaves
cluster-wide objects behind (its ClusterRoles, peering object, admission policy), and an
uninstall that takes the CRDs, and with them every user's RolloutDeployments and
PolicySnapshots, away.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hotload.local import LocalRegions, Region, helm_path
from hotload.local import chart as hotload_chart
from hotload.operator.workload import SIDECAR_CLUSTER_ROLE
from hotload.waiting import wait_until
from tests.fixtures.cluster import Kubectl
from tests.integration.chart.objects import idle_deployment_body

pytestmark = pytest.mark.cluster

GONE_TIMEOUT_S = 120.0


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def _release_objects(api: k8s.ApiClient, release: hotload_chart.ChartRelease) -> dict[str, bool]:
    """Whether each of the release's objects exists, by a readable name."""
    operator, namespace = release.operator_deployment, release.namespace
    fullname = operator.removesuffix("-operator")
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    rbac, custom = k8s.RbacAuthorizationV1Api(api), k8s.CustomObjectsApi(api)
    admission = k8s.AdmissionregistrationV1Api(api)
    reads: dict[str, Callable[[], object]] = {
        "Deployment": lambda: apps.read_namespaced_deployment(operator, namespace),
        "ServiceAccount": lambda: core.read_namespaced_service_account(operator, namespace),
        "Service": lambda: core.read_namespaced_service(f"{operator}-metrics", namespace),
        "ClusterRole": lambda: rbac.read_cluster_role(f"{operator}-cluster"),
        "ClusterRoleBinding": lambda: rbac.read_cluster_role_binding(f"{operator}-cluster"),
        "ClusterKopfPeering": lambda: custom.get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", fullname
        ),
        "ValidatingAdmissionPolicy": lambda: admission.read_validating_admission_policy(
            f"{fullname}-sidecar-own-pod"
        ),
        "ValidatingAdmissionPolicyBinding": (
            lambda: admission.read_validating_admission_policy_binding(
                f"{fullname}-sidecar-own-pod"
            )
        ),
    }
    return {kind: _exists(read) for kind, read in reads.items()}


def _operator_env(api: k8s.ApiClient, release: hotload_chart.ChartRelease) -> list[dict[str, str]]:
    """Each Ready operator pod's plain env values."""
    pods = k8s.CoreV1Api(api).list_namespaced_pod(
        release.namespace,
        label_selector=f"app.kubernetes.io/instance={release.release}",
    )
    return [
        {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}
        for pod in pods.items
        if pod.metadata.deletion_timestamp is None
    ]


def _assert_rights_only_in(
    kubectl: Kubectl, region: Region, release: hotload_chart.ChartRelease, watched: str, other: str
) -> None:
    """Role mode on the real apiserver: rights in the watched namespace, none elsewhere, and
    `bind` on the sidecar ClusterRole through a Role is enough for the operator's binding."""
    subject = f"--as=system:serviceaccount:{release.namespace}:{release.operator_deployment}"
    for where, expected in ((watched, 0), (other, 1)):
        done = kubectl.run(
            "auth", "can-i", "watch", "rolloutdeployments.hotload.dev", "-n", where, subject,
            context=region.context,
        )  # fmt: skip
        assert done.returncode == expected, f"watch in {where}: {done.stdout}{done.stderr}"
    binding = kubectl.run(
        "create", "rolebinding", "probe", f"--clusterrole={SIDECAR_CLUSTER_ROLE}",
        f"--serviceaccount={watched}:probe-sidecar", "-n", watched, "--dry-run=server", subject,
        context=region.context,
    )  # fmt: skip
    assert binding.returncode == 0, binding.stderr


def _revisions(region: Region, release: hotload_chart.ChartRelease) -> list[int]:
    done = subprocess.run(
        [
            str(helm_path()), "--kubeconfig", str(region.kubeconfig),
            "--kube-context", region.context,
            "history", release.release, "-n", release.namespace, "-o", "json",
        ],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [int(entry["revision"]) for entry in json.loads(done.stdout)]


def test_install_upgrade_uninstall_keeps_crds_and_leaves_nothing_else(
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    kubectl: Kubectl,
    namespace: str,
) -> None:
    region = local_regions.regions[-1]
    api = kube_clients[region.name]
    name = f"life-{secrets.token_hex(3)}"
    release = hotload_chart.ChartRelease(
        release=name,
        namespace=name,
        # A plain name: the operator's namespaced rights are a Role there, not a ClusterRole.
        watch_namespaces=(name,),
        values={"operator": {"replicas": 1}, "sidecar": {"createClusterRole": False}},
    )

    hotload_chart.install([region], release)
    hotload_chart.wait_operator([region], release)

    assert all(_release_objects(api, release).values()), _release_objects(api, release)
    _assert_rights_only_in(kubectl, region, release, watched=name, other=namespace)
    assert [env["HOTLOAD_LOG_LEVEL"] for env in _operator_env(api, release)] == ["info"]

    upgraded = hotload_chart.ChartRelease(
        release=name,
        namespace=name,
        watch_namespaces=release.watch_namespaces,
        values={
            "operator": {"replicas": 2, "logLevel": "debug"},
            "sidecar": {"createClusterRole": False},
        },
    )
    hotload_chart.install([region], upgraded)
    hotload_chart.wait_operator([region], upgraded)

    assert [env["HOTLOAD_LOG_LEVEL"] for env in _operator_env(api, upgraded)] == ["debug"] * 2
    assert _exists(
        lambda: k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget(
            upgraded.operator_deployment, name
        )
    ), "two replicas get a PodDisruptionBudget"
    assert _revisions(region, upgraded) == [1, 2]

    # Something of a user's that must survive the uninstall (the CRDs are kept).
    custom = k8s.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        "hotload.dev",
        "v1alpha1",
        namespace,
        "rolloutdeployments",
        cast(Any, idle_deployment_body("kept")),
    )

    hotload_chart.uninstall([region], upgraded)

    def nothing_left() -> bool:
        pods = k8s.CoreV1Api(api).list_namespaced_pod(name).items
        return not pods and not any(_release_objects(api, upgraded).values())

    assert wait_until(nothing_left, GONE_TIMEOUT_S), (
        f"left behind: {_release_objects(api, upgraded)}, "
        f"pods {[p.metadata.name for p in k8s.CoreV1Api(api).list_namespaced_pod(name).items]}"
    )
    extensions = k8s.ApiextensionsV1Api(api)
    for crd in ("rolloutdeployments.hotload.dev", "policysnapshots.hotload.dev"):
        assert _exists(lambda crd=crd: extensions.read_custom_resource_definition(crd)), crd
    assert _exists(
        lambda: extensions.read_custom_resource_definition("clusterkopfpeerings.kopf.dev")
    )
    assert _exists(
        lambda: custom.get_namespaced_custom_object(
            "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", "kept"
        )
    )
    k8s.CoreV1Api(api).delete_namespace(name)
