"""The engine's admin plane, closed in what the chart's operator writes to a real apiserver.

Isolation itself is a cluster's (the local pod runtime shares one network namespace between
pods: docs/security.md); what is proven here is what a cluster would enforce: the Service
names only the front, the NetworkPolicy the operator applies admits ingress on the front's
port only, and the pods it renders bind the engine to their loopback. Issue 22 found the
engines' admin ports reachable by any pod and no NetworkPolicy shipped: on that code (d2baf31)
the NetworkPolicy never appears and the engine container declares its port.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hotload.api.pod import ENGINE_HOST, ENV_ENGINE_HOST, SIDECAR_PORT
from hotload.operator.workload import selector_labels
from hotload.waiting import wait_until

pytestmark = pytest.mark.cluster

RENDER_TIMEOUT_S = 60.0


def _read(call: Any, *args: str) -> Any:
    try:
        return call(*args)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def test_the_operator_exposes_only_the_front_and_fences_the_rest(
    kube_clients: dict[str, k8s.ApiClient], operated_namespace: str, idle_deployment: str
) -> None:
    for api in kube_clients.values():
        networking, core, apps = k8s.NetworkingV1Api(api), k8s.CoreV1Api(api), k8s.AppsV1Api(api)

        def rendered(
            n: k8s.NetworkingV1Api = networking, c: k8s.CoreV1Api = core, a: k8s.AppsV1Api = apps
        ) -> tuple[Any, Any, Any] | None:
            """The three objects the operator renders for the deployment, once all exist (it
            applies them one after another, in no order this test relies on)."""
            objects = (
                _read(n.read_namespaced_network_policy, idle_deployment, operated_namespace),
                _read(c.read_namespaced_service, idle_deployment, operated_namespace),
                _read(a.read_namespaced_stateful_set, idle_deployment, operated_namespace),
            )
            return objects if None not in objects else None

        found = wait_until(rendered, RENDER_TIMEOUT_S)
        assert found, (
            "the operator never applied the deployment's NetworkPolicy, Service and StatefulSet"
        )
        policy, service, sts = found

        assert policy.spec.pod_selector.match_labels == selector_labels(idle_deployment)
        assert policy.spec.policy_types == ["Ingress"]
        assert [[(p.protocol, p.port) for p in rule.ports] for rule in policy.spec.ingress] == [
            [("TCP", SIDECAR_PORT)]
        ]
        assert [rule._from for rule in policy.spec.ingress] == [None], "from anywhere, 8480 only"
        assert [(p.name, p.port) for p in service.spec.ports] == [("http", SIDECAR_PORT)]
        engine, sidecar = sts.spec.template.spec.containers
        assert engine.ports is None and engine.readiness_probe is None
        assert [(p.name, p.container_port) for p in sidecar.ports] == [("http", SIDECAR_PORT)]
        for container in (engine, sidecar):
            env = {e.name: e.value for e in container.env or []}
            assert env[ENV_ENGINE_HOST] == ENGINE_HOST, container.name
