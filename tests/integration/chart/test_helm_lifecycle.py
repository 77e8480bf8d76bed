"""helm install, upgrade and uninstall of the chart behave as users expect, with the real helm
against a real apiserver and the operator's pods run by the pod runtime.

A second, small release with the chart's default scope (one operator replica; no
`watchNamespaces`, so it watches its own namespace with a Role there; no sidecar ClusterRole:
the session's release owns that one) goes through its whole life in one region. It would
catch Roles that grant too little or leak outside the watched namespace (an `auth can-i`
matrix of every write, and a server dry-run of a kube-system StatefulSet running as a
controller's ServiceAccount, which issue 22 saw accepted with the default install), an
upgrade that does not roll the operator, a release that leaves cluster-wide objects behind
(its ClusterRoles, admission policies), and an uninstall that takes the CRDs,
and with them every user's RolloutDeployments and PolicySnapshots, away.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
#: What the operator creates and patches for each RolloutDeployment.
OWNED = (
    "statefulsets.apps", "services", "serviceaccounts",
    "rolebindings.rbac.authorization.k8s.io", "networkpolicies.networking.k8s.io",
)  # fmt: skip


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
    rbac = k8s.RbacAuthorizationV1Api(api)
    admission = k8s.AdmissionregistrationV1Api(api)
    reads: dict[str, Callable[[], object]] = {
        "Deployment": lambda: apps.read_namespaced_deployment(operator, namespace),
        "ServiceAccount": lambda: core.read_namespaced_service_account(operator, namespace),
        "Service": lambda: core.read_namespaced_service(f"{operator}-metrics", namespace),
        "ClusterRole": lambda: rbac.read_cluster_role(f"{operator}-cluster"),
        "ClusterRoleBinding": lambda: rbac.read_cluster_role_binding(f"{operator}-cluster"),
        "Role": lambda: rbac.read_namespaced_role(f"{operator}-leader", namespace),
        "FencingPolicy": lambda: admission.read_validating_admission_policy(
            f"{fullname}-operator-fence"
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


#: Every write the operator makes in a namespace it watches (and nowhere else).
WRITES = [
    *(("create", r) for r in OWNED),
    *(("patch", r) for r in OWNED),
    ("patch", "rolloutdeployments.hotload.dev"),
    ("patch", "rolloutdeployments.hotload.dev/status"),
    ("patch", "policysnapshots.hotload.dev/status"),
    ("delete", "policysnapshots.hotload.dev"),
    ("create", "events"),
]


def _can(kubectl: Kubectl, region: Region, subject: str, verb: str, what: str, where: str) -> bool:
    resource, _, sub = what.partition("/")
    done = kubectl.run(
        "auth", "can-i", verb, resource, "-n", where, subject,
        *([f"--subresource={sub}"] if sub else []), context=region.context,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def _kube_system_statefulset() -> str:
    """A StatefulSet in kube-system running as a controller's ServiceAccount (issue 22)."""
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "probe", "namespace": "kube-system"},
            "spec": {
                "serviceName": "probe",
                "selector": {"matchLabels": {"app": "probe"}},
                "template": {
                    "metadata": {"labels": {"app": "probe"}},
                    "spec": {
                        "serviceAccountName": "generic-garbage-collector",
                        "containers": [{"name": "c", "image": "registry.invalid/x:1"}],
                    },
                },
            },
        }
    )


def _assert_rights_only_in(
    kubectl: Kubectl, region: Region, release: hotload_chart.ChartRelease, watched: str, other: str
) -> None:
    """Role mode on the real apiserver: every write in the watched namespace, none in any
    other (the test's, `default`, `kube-system`), a kube-system StatefulSet refused by the
    server, and `bind` on the sidecar ClusterRole through a Role enough for the operator's
    binding."""
    subject = f"--as=system:serviceaccount:{release.namespace}:{release.operator_deployment}"
    asks = [
        (verb, what, where)
        for where in (watched, other, "default", "kube-system")
        for verb, what in [("watch", "rolloutdeployments.hotload.dev"), *WRITES]
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        allowed = pool.map(lambda ask: _can(kubectl, region, subject, *ask), asks)
        answers = dict(zip(asks, allowed, strict=True))
    missing = [k for k, allowed in answers.items() if k[2] == watched and not allowed]
    excess = [k for k, allowed in answers.items() if k[2] != watched and allowed]
    assert (missing, excess) == ([], []), f"lacks {missing}; must not have {excess}"
    refused = kubectl.run(
        "create", "--dry-run=server", "-f", "-", subject, context=region.context,
        input=_kube_system_statefulset(),
    )  # fmt: skip
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    binding = kubectl.run(
        "create", "rolebinding", "probe", f"--clusterrole={SIDECAR_CLUSTER_ROLE}",
        f"--serviceaccount={watched}:probe-sidecar", "-n", watched, "--dry-run=server", subject,
        context=region.context,
    )  # fmt: skip
    assert binding.returncode == 0, binding.stderr


def _assert_reconciles_with_its_role(api: k8s.ApiClient, namespace: str) -> None:
    """The default scope's operator does its work with the Role alone: it renders a
    deployment's objects in its namespace, and lets the deployment go (its finalizer)."""
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    custom.create_namespaced_custom_object(
        "hotload.dev", "v1alpha1", namespace, "rolloutdeployments",
        cast(Any, idle_deployment_body("scoped")),
    )  # fmt: skip
    rendered = wait_until(
        lambda: _exists(lambda: core.read_namespaced_service("scoped", namespace)),
        GONE_TIMEOUT_S,
    )
    assert rendered, "the operator with the default scope never rendered its deployment"
    custom.delete_namespaced_custom_object(
        "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", "scoped"
    )
    gone = wait_until(
        lambda: (
            not _exists(
                lambda: custom.get_namespaced_custom_object(
                    "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", "scoped"
                )
            )
        ),
        GONE_TIMEOUT_S,
    )
    assert gone, "the deployment kept the operator's finalizer"


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
        # The default scope: the release's own namespace, with a Role there.
        values={"operator": {"replicas": 1}, "sidecar": {"createClusterRole": False}},
    )

    hotload_chart.install([region], release)
    hotload_chart.wait_operator([region], release)

    assert all(_release_objects(api, release).values()), _release_objects(api, release)
    _assert_rights_only_in(kubectl, region, release, watched=name, other=namespace)
    assert [env["HOTLOAD_LOG_LEVEL"] for env in _operator_env(api, release)] == ["info"]
    _assert_reconciles_with_its_role(api, name)

    upgraded = hotload_chart.ChartRelease(
        release=name,
        namespace=name,
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
        lambda: custom.get_namespaced_custom_object(
            "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", "kept"
        )
    )
    k8s.CoreV1Api(api).delete_namespace(name)
