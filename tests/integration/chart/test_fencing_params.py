"""The chart's fencing policies refuse stale operator writes, and nobody else's, Lease or not.

The fencing policies take the leader Lease as their parameter, and the API server looks a
binding's parameter up before it evaluates the policy's match conditions. With
``parameterNotFoundAction: Deny`` every write the policies match was refused, whoever
sent it — every Event created in the cluster, every RolloutDeployment status a user or a
tool sets — until an operator first created the Lease (a fresh install, an operator that
cannot start) and whenever the Lease was deleted. Here a second release's fencing
policies and bindings, rendered by helm from the checkout's chart under another release
name (so with a Lease of their own), go into a region of the session, and their Lease is
created and deleted under them.

Would catch: an admin's Event or RolloutDeployment status refused while the Lease is
missing; an operator write with a stale fence let through while the Lease exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hotload.local import LocalRegions
from hotload.waiting import wait_until
from tests.integration.chart.objects import IDLE, idle_deployment_body
from tests.integration.chart.rendering import Manifest, find, one, render

pytestmark = pytest.mark.cluster

RELEASE = "fence-params"
HOLDER = "fence-params-operator-0_abcd"
TRANSITIONS = 3


def _create_event(core: k8s.CoreV1Api, namespace: str, fence: str | None) -> None:
    annotations = {} if fence is None else {"hotload.dev/fence": fence}
    core.create_namespaced_event(
        namespace,
        cast(
            Any,
            {
                "metadata": {"generateName": "fence-params-", "annotations": annotations},
                "involvedObject": {"kind": "Pod", "namespace": namespace, "name": "fence-params"},
                "reason": "FenceParams",
                "message": "written by tests/integration/chart/test_fencing_params.py",
                "type": "Normal",
            },
        ),
    )


def _refusal(call: Callable[[], object]) -> str:
    """The API server's refusal of ``call`` ('' when it was accepted)."""
    try:
        call()
    except ApiException as err:
        return str(err.body)
    return ""


@pytest.fixture
def fencing_objects(
    tmp_path: Path, kube_clients: dict[str, k8s.ApiClient], local_regions: LocalRegions
) -> Iterator[tuple[k8s.ApiClient, list[Manifest]]]:
    """The second release's fencing policies and bindings, in the first region; removed
    after."""
    api = kube_clients[local_regions.regions[0].name]
    objects = render(tmp_path, release=RELEASE)
    policies = [
        o
        for o in find(objects, "ValidatingAdmissionPolicy")
        if "-operator-fence" in o["metadata"]["name"]
    ]
    bindings = [
        o
        for o in find(objects, "ValidatingAdmissionPolicyBinding")
        if o["spec"]["policyName"] in {p["metadata"]["name"] for p in policies}
    ]
    assert len(policies) == len(bindings) == 2
    admission = k8s.AdmissionregistrationV1Api(api)
    try:
        with _unless_status(409):
            k8s.CoreV1Api(api).create_namespace(
                cast(Any, {"metadata": {"name": bindings[0]["spec"]["paramRef"]["namespace"]}})
            )
        for policy in policies:
            admission.create_validating_admission_policy(cast(Any, policy))
        for binding in bindings:
            admission.create_validating_admission_policy_binding(cast(Any, binding))
        yield api, objects
    finally:
        for binding in bindings:
            with _unless_status(404):
                admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        for policy in policies:
            with _unless_status(404):
                admission.delete_validating_admission_policy(policy["metadata"]["name"])


@contextlib.contextmanager
def _unless_status(status: int) -> Iterator[None]:
    """Let an ApiException of ``status`` pass (409: already there; 404: already gone)."""
    try:
        yield
    except ApiException as err:
        if err.status != status:
            raise


def _as_operator(api: k8s.ApiClient, objects: list[Manifest]) -> k8s.ApiClient:
    """The release's operator account, impersonated (with an admin's rights, so only the
    policies, not RBAC, stand in its way)."""
    account = one(objects, "ServiceAccount")["metadata"]
    operator = k8s.ApiClient(api.configuration)
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    operator.set_default_header("Impersonate-User", user)  # type: ignore[no-untyped-call]
    operator.set_default_header("Impersonate-Group", "system:masters")  # type: ignore[no-untyped-call]
    return operator


def test_stale_operator_writes_are_refused_and_nobody_elses_with_or_without_the_lease(
    fencing_objects: tuple[k8s.ApiClient, list[Manifest]], namespace: str
) -> None:
    api, objects = fencing_objects
    binding = one(objects, "ValidatingAdmissionPolicyBinding", f"{RELEASE}-hotload-operator-fence")
    lease_name = binding["spec"]["paramRef"]["name"]
    lease_namespace = binding["spec"]["paramRef"]["namespace"]
    leases = k8s.CoordinationV1Api(api)
    admin = k8s.CoreV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    operator = _as_operator(api, objects)
    operator_core = k8s.CoreV1Api(operator)
    leases.create_namespaced_lease(
        lease_namespace,
        cast(
            Any,
            {
                "metadata": {"name": lease_name},
                "spec": {"holderIdentity": HOLDER, "leaseTransitions": TRANSITIONS},
            },
        ),
    )
    try:
        # The Lease is there: a stale fence is refused once the policies are in force, the
        # Lease's own token is not.
        stale = wait_until(
            lambda: _refusal(lambda: _create_event(operator_core, namespace, "old-holder/2")),
            30,
        )
        assert "hotload-fence" in stale, stale
        assert not _refusal(
            lambda: _create_event(operator_core, namespace, f"{HOLDER}/{TRANSITIONS}")
        )
        assert not _refusal(lambda: _create_event(admin, namespace, None))

        leases.delete_namespaced_lease(lease_name, lease_namespace)
        # Without the Lease nothing is refused, once the API server has seen it go: not
        # even the operator's stale write (no replica leads without the Lease).
        gone = wait_until(
            lambda: not _refusal(lambda: _create_event(operator_core, namespace, "old-holder/2")),
            30,
        )
        assert gone, _refusal(lambda: _create_event(operator_core, namespace, "old-holder/2"))
        assert not _refusal(lambda: _create_event(admin, namespace, None))
        custom.create_namespaced_custom_object(
            "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", idle_deployment_body()
        )
        target = {
            "status": {
                "targetSnapshot": {
                    "identity": "by-hand", "step": 1, "kind": "Full", "kvCachePolicy": "all",
                }
            }
        }  # fmt: skip
        assert not _refusal(
            lambda: custom.patch_namespaced_custom_object_status(
                "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", IDLE, target
            )
        )
    finally:
        operator.close()  # type: ignore[no-untyped-call]
        with _unless_status(404):
            leases.delete_namespaced_lease(lease_name, lease_namespace)
