"""Least privilege, proven on the real apiserver with the chart installed by helm.

The session's release runs the chart's explicit cluster-wide mode (its tests need fresh
`hl-*` namespaces); the default mode, Roles in the watched namespaces and no write anywhere
else, is proven by tests/integration/chart/test_helm_lifecycle.py on a release of its own.

`kubectl auth can-i` (impersonating each ServiceAccount) answers for every verb the operator
and a sidecar need, and for the ones they must not have. It would catch a rule widened by
accident (pods writable by the operator, secrets readable, any ClusterRole bindable, a
sidecar able to list pods or edit its deployment) and a rule the operator needs but lost.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hotload.local import LocalRegions
from hotload.operator.workload import SIDECAR_CLUSTER_ROLE, sidecar_service_account
from hotload.waiting import wait_until
from tests.fixtures.cluster import SESSION_CHART, Kubectl

pytestmark = pytest.mark.cluster

OPERATOR = f"system:serviceaccount:{SESSION_CHART.namespace}:{SESSION_CHART.operator_deployment}"
BINDING_TIMEOUT_S = 60.0
#: The namespace the can-i questions are asked about: one the session's operator watches.
WATCHED = "hl-any"
#: The leader Lease, in the release's namespace (the chart's default name).
LEASE = f"{SESSION_CHART.operator_deployment.removesuffix('-operator')}-leader"
RELEASE_NS = SESSION_CHART.namespace


@dataclass(frozen=True)
class Ask:
    """One `kubectl auth can-i` question: ``verb resource[/name]`` in a namespace."""

    verb: str
    resource: str
    namespace: str | None = WATCHED
    subresource: str | None = None

    def argv(self, subject: str) -> list[str]:
        argv = ["auth", "can-i", self.verb, self.resource, f"--as={subject}"]
        # A cluster-scoped question is asked with no namespace at all (-A), never "default".
        argv += ["-n", self.namespace] if self.namespace else ["--all-namespaces"]
        argv += [f"--subresource={self.subresource}"] if self.subresource else []
        return argv

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {self.resource}{sub} in {self.namespace or 'the cluster'}"


OPERATOR_MAY = [
    *(Ask(v, "rolloutdeployments.hotload.dev") for v in ("get", "list", "watch", "patch")),
    *(Ask(v, "policysnapshots.hotload.dev") for v in ("get", "list", "watch", "patch", "delete")),
    Ask("patch", "rolloutdeployments.hotload.dev", subresource="status"),
    Ask("patch", "policysnapshots.hotload.dev", subresource="status"),
    *(Ask(v, "pods") for v in ("get", "list", "watch")),
    *(Ask(v, "statefulsets.apps") for v in ("get", "list", "watch", "create", "patch")),
    *(Ask(v, "services") for v in ("get", "list", "watch", "create", "patch")),
    *(Ask(v, "serviceaccounts") for v in ("get", "list", "watch", "create", "patch")),
    *(Ask(v, "rolebindings.rbac.authorization.k8s.io") for v in ("get", "create", "patch")),
    *(Ask(v, "networkpolicies.networking.k8s.io") for v in ("get", "create", "patch")),
    Ask("create", "events"),
    Ask("list", "namespaces", namespace=None),
    Ask("watch", "customresourcedefinitions.apiextensions.k8s.io", namespace=None),
    *(Ask(v, f"leases.coordination.k8s.io/{LEASE}", RELEASE_NS) for v in ("get", "update")),
    Ask("create", "leases.coordination.k8s.io", RELEASE_NS),
]
OPERATOR_MAY_NOT = [
    *(Ask(v, "pods") for v in ("create", "update", "patch", "delete")),
    Ask("patch", "pods", subresource="status"),
    Ask("create", "pods", subresource="exec"),
    *(Ask(v, "secrets") for v in ("get", "list")),
    Ask("get", "configmaps"),
    Ask("create", "rolloutdeployments.hotload.dev"),
    Ask("delete", "rolloutdeployments.hotload.dev"),
    Ask("create", "policysnapshots.hotload.dev"),
    Ask("update", "policysnapshots.hotload.dev"),
    Ask("update", "rolloutdeployments.hotload.dev", subresource="status"),
    Ask("patch", "events"),
    Ask("delete", "statefulsets.apps"),
    Ask("delete", "networkpolicies.networking.k8s.io"),
    Ask("create", "roles.rbac.authorization.k8s.io"),
    Ask("escalate", "roles.rbac.authorization.k8s.io"),
    Ask("create", "clusterrolebindings.rbac.authorization.k8s.io", namespace=None),
    Ask("update", "leases.coordination.k8s.io/someone-else", RELEASE_NS),
    Ask("update", f"leases.coordination.k8s.io/{LEASE}"),
    Ask("delete", f"leases.coordination.k8s.io/{LEASE}", RELEASE_NS),
    Ask("create", "customresourcedefinitions.apiextensions.k8s.io", namespace=None),
    Ask("delete", "namespaces", namespace=None),
    Ask("impersonate", "serviceaccounts"),
]


def _sidecar_asks(namespace: str, other: str) -> tuple[list[Ask], list[Ask]]:
    may = [
        *(Ask(v, "rolloutdeployments.hotload.dev", namespace) for v in ("get", "list", "watch")),
        Ask("get", "pods", namespace),
        Ask("watch", "pods", namespace),  # its own, by name (the report's repairs)
        Ask("patch", "pods", namespace),
        Ask("get", "pods", namespace, subresource="status"),
        Ask("patch", "pods", namespace, subresource="status"),
    ]
    may_not = [
        *(Ask(v, "pods", namespace) for v in ("list", "create", "update", "delete")),
        Ask("create", "pods", namespace, subresource="exec"),
        Ask("create", "pods", namespace, subresource="eviction"),
        Ask("patch", "rolloutdeployments.hotload.dev", namespace),
        Ask("patch", "rolloutdeployments.hotload.dev", namespace, subresource="status"),
        Ask("get", "policysnapshots.hotload.dev", namespace),
        Ask("get", "secrets", namespace),
        Ask("create", "events", namespace),
        Ask("patch", "statefulsets.apps", namespace),
        Ask("get", "pods", other),
        Ask("patch", "pods", other),
        Ask("watch", "rolloutdeployments.hotload.dev", other),
    ]
    return may, may_not


def _answers(
    kubectl: Kubectl, subject: str, asks: list[Ask], context: str | None
) -> dict[str, bool]:
    def ask(question: Ask) -> bool:
        done = kubectl.run(*question.argv(subject), context=context)
        assert done.returncode in (0, 1), done.stderr
        assert "warning" not in done.stderr.lower(), f"{question}: {done.stderr}"
        return done.returncode == 0

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(map(str, asks), pool.map(ask, asks), strict=True))


def _assert_matrix(
    kubectl: Kubectl,
    subject: str,
    may: list[Ask],
    may_not: list[Ask],
    context: str | None = None,
) -> None:
    answers = _answers(kubectl, subject, may + may_not, context)
    missing = [str(a) for a in may if not answers[str(a)]]
    excess = [str(a) for a in may_not if answers[str(a)]]
    assert (missing, excess) == ([], []), f"{subject}: lacks {missing}; must not have {excess}"


def test_operator_has_exactly_the_rights_it_needs(
    local_regions: LocalRegions, kubectl: Kubectl
) -> None:
    for region in local_regions.regions:
        _assert_matrix(kubectl, OPERATOR, OPERATOR_MAY, OPERATOR_MAY_NOT, region.context)


def test_the_cluster_wide_mode_grants_what_docs_chart_md_says_it_does(
    local_regions: LocalRegions, kubectl: Kubectl
) -> None:
    """docs/chart.md, "Cluster-wide mode": writes of owned kinds in every namespace, the
    system's included, and still no pods, secrets or roles anywhere."""
    owned = (
        "statefulsets.apps",
        "services",
        "serviceaccounts",
        "networkpolicies.networking.k8s.io",
    )
    may = [
        Ask(verb, what, namespace="kube-system") for what in owned for verb in ("create", "patch")
    ]
    may_not = [
        Ask("create", "pods", namespace="kube-system"),
        Ask("get", "secrets", namespace="kube-system"),
        Ask("create", "roles.rbac.authorization.k8s.io", namespace="kube-system"),
    ]
    _assert_matrix(kubectl, OPERATOR, may, may_not, local_regions.regions[0].context)


@pytest.mark.parametrize(
    ("cluster_role", "allowed"), [("hotload-sidecar", True), ("admin", False), ("edit", False)]
)
def test_operator_binds_accounts_to_the_sidecar_role_and_no_other(
    kubectl: Kubectl, cluster_role: str, allowed: bool
) -> None:
    """RBAC's escalation check on a real RoleBinding (server-side dry run): the operator holds
    `bind` on hotload-sidecar only, and none of the rights of the roles it would hand out."""
    done = kubectl.run(
        "create", "rolebinding", "probe", f"--clusterrole={cluster_role}",
        "--serviceaccount=default:probe-sidecar", "-n", "default",
        "--dry-run=server", f"--as={OPERATOR}",
    )  # fmt: skip

    assert (done.returncode == 0) is allowed, done.stderr
    if not allowed:
        refusal = "attempting to grant RBAC permissions not currently held"
        assert refusal in done.stderr, done.stderr[:300]


def test_sidecar_account_the_operator_binds_reads_its_deployment_and_writes_pods_only(
    kubectl: Kubectl,
    kube_clients: dict[str, k8s.ApiClient],
    operated_namespace: str,
    idle_deployment: str,
) -> None:
    """The operator's own binding (RoleBinding to the chart's ClusterRole) gives exactly that."""
    api = next(iter(kube_clients.values()))
    rbac = k8s.RbacAuthorizationV1Api(api)
    account = sidecar_service_account(idle_deployment)

    def binding() -> k8s.V1RoleBinding | None:
        try:
            return rbac.read_namespaced_role_binding(account, operated_namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    bound = wait_until(binding, BINDING_TIMEOUT_S)
    assert bound is not None, f"the operator never bound {account}"
    assert (bound.role_ref.kind, bound.role_ref.name) == ("ClusterRole", SIDECAR_CLUSTER_ROLE)
    assert not rbac.list_namespaced_role(operated_namespace).items, "no per-deployment Role"
    may, may_not = _sidecar_asks(operated_namespace, other="default")

    _assert_matrix(kubectl, f"system:serviceaccount:{operated_namespace}:{account}", may, may_not)
