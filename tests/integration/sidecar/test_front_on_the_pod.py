"""The front of a real replica pod, on the pod's port and through the Service the operator
renders for its deployment (the pod runtime's proxy): the engine's admin plane is not
reachable through either.

Issue 22 read the engine's identity, the cache listing with every user's session ids, and
resumed a paused engine with ``/v1/../admin/*`` on the pod port and through the region's
Service; on that code (d2baf31) this test fails at the first request.
"""

from __future__ import annotations

import json

import pytest

from hotload.api import RolloutDeployment
from hotload.api.pod import SIDECAR_PORT
from hotload.local.runtime.service_ports import read_ports
from hotload.operator.workload import service
from tests.fixtures.trainer import Trainer
from tests.integration.sidecar.front_server import raw_request
from tests.integration.sidecar.harness import SidecarHarness, eventually, rollout_deployment

pytestmark = pytest.mark.cluster

TRAVERSALS = ("/v1/../admin/identity", "/v1/%2e%2e/admin/cache", "/v1/..%2Fadmin/identity")


async def test_the_engines_admin_routes_are_unreachable_through_pod_and_service(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    body = rollout_deployment("edge", bucket_url)
    harness.create_deployment(body)
    replica = await harness.replica("edge-0", "edge")
    full = await trainer.publish_full()
    harness.set_target("edge", full.ref())
    await harness.wait_state(replica, full.identity, "Ready")  # in its Service from then on
    deployment = RolloutDeployment.model_validate(
        {**body, "metadata": {**body["metadata"], "namespace": harness.namespace}}
    )
    harness.core.create_namespaced_service(harness.namespace, service(deployment))

    def service_port() -> int | None:
        ports = read_ports(harness.region.services_file)
        return ports.get(f"{harness.namespace}/edge", {}).get("http")

    port = await eventually(service_port, timeout=60, what="the Service's local port")

    def serving() -> bool:  # the gate's condition follows the annotations, then the proxy
        return raw_request("127.0.0.1", port, "GET", "/v1/models").status == 200

    await eventually(serving, timeout=60, what="the Service to route to the Ready pod")
    fronts = {"pod": (replica.ip, SIDECAR_PORT), "service": ("127.0.0.1", port)}

    for where, (host, at) in fronts.items():
        for target in TRAVERSALS:
            answer = raw_request(host, at, "GET", target)
            assert answer.status == 400, (where, target, answer.status, answer.body[:200])
        resume = raw_request(host, at, "POST", "/v1/../admin/resume", b"{}")
        assert resume.status == 400, (where, resume.body[:200])
        models = raw_request(host, at, "GET", "/v1/models")
        assert models.status == 200, (where, models.body[:200])
        assert json.loads(models.body)["data"], where
