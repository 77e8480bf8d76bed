"""A sidecar writes only its own pod, and there only what it reports: the chart's
ValidatingAdmissionPolicy on the real apiserver, with real pod-bound tokens from the
TokenRequest API (what the pod runtime, like a kubelet, gives each container).

RBAC lets a sidecar patch every pod of its namespace; the policy narrows that to the pod
named in its token. It would catch a policy that lets replica A mark replica B ready, lets a
sidecar relabel itself out of its Service or edit its own spec, touches another writer's
conditions or annotations, accepts a token bound to no pod — and a policy so broad that it
gets in the way of admins or of other workloads' service accounts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hotload.api.pod import CONDITION_SNAPSHOT_READY
from hotload.local import LocalRegions, Region
from hotload.local.bootstrap import FAKE_NODE_TAINT

pytestmark = pytest.mark.cluster

SIDECAR = "replicas-sidecar"
TOLERATION = {"key": FAKE_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Replicas:
    """Two pods of one sidecar ServiceAccount, and a client per pod-bound token."""

    namespace: str
    admin: k8s.CoreV1Api
    a: k8s.CoreV1Api
    """Replica A's sidecar: a token bound to pod ``replica-a``."""
    unbound: k8s.CoreV1Api
    """The same ServiceAccount with a token bound to no pod."""


def _client(region: Region, token: str) -> k8s.ApiClient:
    config = k8s.Configuration()
    config.host = region.apiserver_url
    config.ssl_ca_cert = str(region.certificates.ca_cert)
    config.api_key = {"authorization": f"Bearer {token}"}
    return k8s.ApiClient(config)


def _token(core: k8s.CoreV1Api, namespace: str, pod: k8s.V1Pod | None) -> str:
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": 600}
    if pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "uid": pod.metadata.uid,
        }
    answer = core.create_namespaced_service_account_token(
        SIDECAR, namespace, cast(Any, {"spec": spec})
    )
    return cast(str, answer.status.token)


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"app": "replicas"},
            "annotations": {"example.com/owner": "team-a"},
        },
        "spec": {
            "serviceAccountName": SIDECAR,
            "tolerations": [TOLERATION],
            "containers": [{"name": "engine", "image": "engine", "command": ["serve"]}],
        },
    }


def _role_binding(name: str, namespace: str, role_kind: str, role: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


@pytest.fixture
def replicas(
    local_regions: LocalRegions, kube_clients: dict[str, k8s.ApiClient], namespace: str
) -> Iterator[Replicas]:
    region = local_regions.regions[0]
    admin = k8s.CoreV1Api(kube_clients[region.name])
    rbac = k8s.RbacAuthorizationV1Api(kube_clients[region.name])
    admin.create_namespaced_service_account(namespace, cast(Any, {"metadata": {"name": SIDECAR}}))
    rbac.create_namespaced_role_binding(
        namespace, cast(Any, _role_binding(SIDECAR, namespace, "ClusterRole", "hotload-sidecar"))
    )
    pod_a = admin.create_namespaced_pod(namespace, cast(Any, _pod("replica-a")))
    admin.create_namespaced_pod(namespace, cast(Any, _pod("replica-b")))
    clients = [
        _client(region, _token(admin, namespace, pod_a)),
        _client(region, _token(admin, namespace, None)),
    ]
    try:
        yield Replicas(namespace, admin, *(k8s.CoreV1Api(c) for c in clients))
    finally:
        for api in clients:
            api.close()  # type: ignore[no-untyped-call]


def _refused(call: Callable[[], object], saying: str) -> None:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status in (403, 422), refused.value.body
    assert saying in str(refused.value.body), refused.value.body


def _annotate(
    core: k8s.CoreV1Api, namespace: str, pod: str, notes: dict[str, str | None]
) -> k8s.V1Pod:
    return core.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": notes}})


def _condition(core: k8s.CoreV1Api, namespace: str, pod: str, kind: str, status: str) -> k8s.V1Pod:
    body = {"status": {"conditions": [{"type": kind, "status": status, "reason": "Test"}]}}
    return core.patch_namespaced_pod_status(pod, namespace, body)


def test_a_sidecar_reports_on_its_own_pod(replicas: Replicas) -> None:
    ns = replicas.namespace

    _annotate(replicas.a, ns, "replica-a", {"hotload.dev/state": "Ready"})
    _condition(replicas.a, ns, "replica-a", CONDITION_SNAPSHOT_READY, "True")
    _annotate(replicas.a, ns, "replica-a", {"hotload.dev/state": None})

    pod = replicas.admin.read_namespaced_pod("replica-a", ns)
    assert "hotload.dev/state" not in pod.metadata.annotations
    assert pod.metadata.annotations["example.com/owner"] == "team-a"
    conditions = {c.type: c.status for c in pod.status.conditions or []}
    assert conditions[CONDITION_SNAPSHOT_READY] == "True"


def test_replica_a_cannot_write_replica_b(replicas: Replicas) -> None:
    ns = replicas.namespace

    _refused(
        lambda: _annotate(replicas.a, ns, "replica-b", {"hotload.dev/state": "Ready"}),
        "bound to pod replica-a, not replica-b",
    )
    _refused(
        lambda: _condition(replicas.a, ns, "replica-b", CONDITION_SNAPSHOT_READY, "True"),
        "bound to pod replica-a, not replica-b",
    )
    pod_b = replicas.admin.read_namespaced_pod("replica-b", ns)
    assert "hotload.dev/state" not in (pod_b.metadata.annotations or {})


def test_a_sidecar_cannot_touch_its_own_spec_labels_or_other_metadata(replicas: Replicas) -> None:
    ns, a = replicas.namespace, replicas.a

    _refused(
        lambda: a.patch_namespaced_pod("replica-a", ns, {"spec": {"activeDeadlineSeconds": 5}}),
        "may not change a pod's spec",
    )
    _refused(
        lambda: a.patch_namespaced_pod("replica-a", ns, {"metadata": {"labels": {"app": "gone"}}}),
        "labels",
    )
    _refused(
        lambda: a.patch_namespaced_pod(
            "replica-a", ns, {"metadata": {"finalizers": ["example.com/hold"]}}
        ),
        "finalizers",
    )
    _refused(
        lambda: _annotate(a, ns, "replica-a", {"example.com/owner": "me"}),
        "only the hotload.dev/ annotations",
    )
    _refused(
        lambda: _annotate(a, ns, "replica-a", {"example.com/owner": None}),
        "only the hotload.dev/ annotations",
    )


def test_a_sidecar_cannot_write_other_conditions_or_status(replicas: Replicas) -> None:
    ns, a = replicas.namespace, replicas.a

    _refused(
        lambda: _condition(a, ns, "replica-a", "Ready", "True"),
        "only its pod's hotload.dev/SnapshotReady condition",
    )
    _refused(
        lambda: _condition(a, ns, "replica-a", "example.com/Warm", "True"),
        "only its pod's hotload.dev/SnapshotReady condition",
    )
    _refused(
        lambda: a.patch_namespaced_pod_status(
            "replica-a", ns, {"status": {"message": "all good", "reason": "Fine"}}
        ),
        "may not change its pod's phase, addresses or container statuses",
    )


def test_the_whole_report_in_one_status_write_and_nothing_else_through_status(
    replicas: Replicas,
) -> None:
    """The sidecar sends its report as one patch of ``pods/status`` (annotations and its
    condition); the policy skips the spec comparison there (the API server keeps the spec
    of a status write) but still guards the metadata a status write can change."""
    ns, a = replicas.namespace, replicas.a
    report = {
        "metadata": {"annotations": {"hotload.dev/state": "Ready", "hotload.dev/target": "s-1"}},
        "status": {"conditions": [{"type": CONDITION_SNAPSHOT_READY, "status": "True",
                                   "reason": "Verified"}]},
    }  # fmt: skip
    a.patch_namespaced_pod_status("replica-a", ns, report)
    pod = replicas.admin.read_namespaced_pod("replica-a", ns)
    assert pod.metadata.annotations["hotload.dev/target"] == "s-1"
    assert {c.type: c.status for c in pod.status.conditions or []}[CONDITION_SNAPSHOT_READY] == (
        "True"
    )
    _refused(
        lambda: a.patch_namespaced_pod_status(
            "replica-a", ns, {"metadata": {"annotations": {"example.com/owner": "me"}}}
        ),
        "only the hotload.dev/ annotations",
    )
    _refused(
        lambda: a.patch_namespaced_pod_status(
            "replica-a", ns, {"metadata": {"labels": {"app": "gone"}}}
        ),
        "labels",
    )
    _refused(
        lambda: a.patch_namespaced_pod_status(
            "replica-b", ns, {"metadata": {"annotations": {"hotload.dev/state": "Ready"}}}
        ),
        "bound to pod replica-a, not replica-b",
    )


def test_a_token_bound_to_no_pod_writes_no_pod(replicas: Replicas) -> None:
    _refused(
        lambda: _annotate(
            replicas.unbound, replicas.namespace, "replica-a", {"hotload.dev/state": "Ready"}
        ),
        "this token names no pod",
    )


def test_admins_and_other_service_accounts_are_left_alone(
    replicas: Replicas, kube_clients: dict[str, k8s.ApiClient], local_regions: LocalRegions
) -> None:
    """An account named like a sidecar that does not hold the sidecar role (another app's
    `cache-sidecar` with its own Role to label pods) keeps what RBAC gives it."""
    ns = replicas.namespace
    region = local_regions.regions[0]
    rbac = k8s.RbacAuthorizationV1Api(kube_clients[region.name])
    other = "cache-sidecar"
    replicas.admin.create_namespaced_service_account(ns, cast(Any, {"metadata": {"name": other}}))
    rbac.create_namespaced_role(
        ns,
        cast(
            Any,
            {
                "metadata": {"name": other},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
            },
        ),
    )
    rbac.create_namespaced_role_binding(ns, cast(Any, _role_binding(other, ns, "Role", other)))
    token = replicas.admin.create_namespaced_service_account_token(
        other, ns, cast(Any, {"spec": {"audiences": [], "expirationSeconds": 600}})
    ).status.token
    api = _client(region, token)
    try:
        k8s.CoreV1Api(api).patch_namespaced_pod(
            "replica-b", ns, {"metadata": {"labels": {"cache": "warm"}}}
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]

    replicas.admin.patch_namespaced_pod(
        "replica-a", ns, {"metadata": {"labels": {"admin": "was-here"}}}
    )
    assert replicas.admin.read_namespaced_pod("replica-b", ns).metadata.labels["cache"] == "warm"
