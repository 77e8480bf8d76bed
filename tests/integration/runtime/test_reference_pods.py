"""The reference pod (examples/pod.yaml) as a StatefulSet of three, run for real.

Each pod's containers are ``hotload engine reference`` and ``hotload sidecar``: both
listen on the pod's own 127.i.x.y address, the sidecar talks to the API with its pod's
bound token (a call its RBAC does not grant is refused with 403), and a pod turns Ready
only once its sidecar has loaded the deployment's target and set
``hotload.dev/SnapshotReady``. A killed sidecar shows up as a terminated container and
a restart, and the pod comes back Ready.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from hotload.api import API_VERSION
from hotload.api.pod import CONDITION_SNAPSHOT_READY, SIDECAR_RBAC_RULES
from hotload.local import Region
from hotload.storage import open_storage
from tests.fixtures.trainer import Trainer
from tests.integration.runtime.conftest import (
    condition,
    container_logs,
    container_status,
    read_pod,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[3] / "examples" / "pod.yaml"
REPLICAS = 3


def _pid(pod: dict[str, Any], container: str) -> int:
    return int(container_status(pod, container)["containerID"].rsplit("/", 1)[-1])


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_reference_pods_serve_on_their_own_addresses_and_turn_ready_by_their_sidecar(
    core: k8s.CoreV1Api,
    kube_clients: dict[str, k8s.ApiClient],
    region: Region,
    namespace: str,
    tmp_path: Path,
) -> None:
    api = kube_clients[region.name]
    example = yaml.safe_load(EXAMPLE.read_text())
    deployment = example["spec"]["containers"][1]["env"][4]["value"]
    account = example["spec"]["serviceAccountName"]
    bucket = tmp_path / "bucket"
    bucket.mkdir()

    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac = k8s.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace, {"metadata": {"name": account}, "rules": list(SIDECAR_RBAC_RULES)}
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    group, version = API_VERSION.split("/")
    custom = k8s.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        group,
        version,
        namespace,
        "rolloutdeployments",
        {
            "apiVersion": API_VERSION,
            "kind": "RolloutDeployment",
            "metadata": {"name": deployment},
            "spec": {
                "model": {"name": "reference-tiny", "servedName": deployment},
                "engine": {"kind": "reference", "port": 8000},
                "replicas": REPLICAS,
                "hotLoad": {"bucketUrl": f"file://{bucket}", "transition": "ASYNC"},
            },
        },
    )

    async def publish() -> dict[str, Any]:
        storage = open_storage(f"file://{bucket}")
        try:
            published = await Trainer(tmp_path / "trainer", storage).publish_full()
        finally:
            await storage.aclose()
        return dict(published.ref().to_k8s())

    # The sidecar makes its engine client (and answers /readyz) once it has a target.
    target = asyncio.run(publish())
    custom.patch_namespaced_custom_object_status(
        group,
        version,
        namespace,
        "rolloutdeployments",
        deployment,
        {"status": {"targetSnapshot": target}},
    )

    template = copy.deepcopy(example)
    labels = template["metadata"]["labels"]
    k8s.AppsV1Api(api).create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": deployment},
            "spec": {
                "replicas": REPLICAS,
                "serviceName": deployment,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
            },
        },
    )
    names = [f"{deployment}-{n}" for n in range(REPLICAS)]

    def all_ready() -> list[dict[str, Any]] | None:
        current = [read_pod(core, namespace, name) or {} for name in names]
        return current if all(condition(p, "Ready") == "True" for p in current) else None

    try:
        pods = wait_for("every pod Ready once it serves the target", all_ready, 420, every=1.0)
    except AssertionError as err:
        logs = "\n".join(container_logs(region, namespace, name) for name in names)
        raise AssertionError(f"{err}\n{logs}") from err
    with httpx.Client(trust_env=False, timeout=10) as client:
        for pod in pods:
            ip = pod["status"]["podIP"]
            assert ip.startswith(f"127.{region.index}.")
            assert client.get(f"http://{ip}:8480/healthz").status_code == 200
            assert client.get(f"http://{ip}:8000/health").status_code == 200
            times = {c["type"]: c["lastTransitionTime"] for c in pod["status"]["conditions"]}
            assert condition(pod, CONDITION_SNAPSHOT_READY) == "True"
            assert times["Ready"] >= times[CONDITION_SNAPSHOT_READY], (
                "Ready turned True only once the sidecar's gate had"
            )

    sidecar_env = _environ(_pid(pods[0], "sidecar"))
    with k8s_config.new_client_from_config(config_file=sidecar_env["KUBECONFIG"]) as pod_api:
        with pytest.raises(k8s.ApiException) as refused:
            k8s.CoreV1Api(pod_api).list_namespaced_secret(namespace)
        assert refused.value.status == 403, "the sidecar runs with its ServiceAccount's RBAC only"
        own = k8s.CoreV1Api(pod_api).read_namespaced_pod(names[0], namespace)
        assert own.metadata.name == names[0]

    victim = pods[2]
    pid = _pid(victim, "sidecar")
    os.kill(pid, signal.SIGKILL)

    def back() -> dict[str, Any] | None:
        pod = read_pod(core, namespace, names[2]) or {}
        status = container_status(pod, "sidecar")
        ok = status.get("restartCount") == 1 and condition(pod, "Ready") == "True"
        return pod if ok else None

    pod = wait_for("the killed sidecar restarted and the pod Ready again", back, 180, every=1.0)
    last = container_status(pod, "sidecar")["lastState"]["terminated"]
    assert last["exitCode"] == 137 and last["containerID"].endswith(f"/{pid}")
    assert container_status(pod, "engine")["restartCount"] == 0
