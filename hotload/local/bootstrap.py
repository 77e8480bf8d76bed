"""What a fresh region needs besides its processes: our CRDs (Established) and fake GPU
nodes (Ready, untainted by the node lifecycle controller, so pods schedule).

The CRDs are rendered from ``hotload.api`` (the same objects as ``crds/``, which a test
keeps equal), so an installed hotload brings its own. Calls go through the ``kubernetes``
client with the region's admin kubeconfig; its errors become ours here.
"""

from __future__ import annotations

import logging
from typing import Any, Final, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from hotload.api.crd import render_all
from hotload.errors import KubeError
from hotload.kube.errors import map_api_exception
from hotload.local.readiness import wait_for
from hotload.local.region import Region

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S: Final = 10.0
REGION_LABEL: Final = "topology.kubernetes.io/region"
GPU_RESOURCE: Final = "nvidia.com/gpu"
FAKE_NODE_TAINT: Final = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
#: Generous CPU and memory: scheduling is bounded by GPUs and pods, as on a GPU node.
NODE_CPU: Final = "128"
NODE_MEMORY: Final = "1Ti"
NODE_PODS: Final = "256"


def api_client(region: Region) -> k8s.ApiClient:
    """A ``kubernetes`` client for ``region`` as its admin."""
    api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(region.admin_kubeconfig)
    )
    return cast(k8s.ApiClient, api)


def _kube_error(err: ApiException, what: str, **context: Any) -> KubeError:
    """The one mapping (``hotload.kube``), with what we were doing as context."""
    return map_api_exception(err, operation=what, **context)


def apply_crds(api: k8s.ApiClient, region: Region) -> list[str]:
    """Create our CRDs, or replace them with the current rendering; return their names."""
    extensions = k8s.ApiextensionsV1Api(api)
    names = []
    for crd in render_all().values():
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            extensions.create_custom_resource_definition(
                cast(Any, crd), _request_timeout=REQUEST_TIMEOUT_S
            )
            continue
        except ApiException as err:
            if err.status != 409:
                raise _kube_error(err, "creating a CRD", region=region.name, crd=name) from err
        try:
            current = extensions.read_custom_resource_definition(
                name, _request_timeout=REQUEST_TIMEOUT_S
            )
            version = current.metadata.resource_version if current.metadata else None
            body = {**crd, "metadata": {**crd["metadata"], "resourceVersion": version}}
            extensions.replace_custom_resource_definition(
                name, cast(Any, body), _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            raise _kube_error(err, "updating a CRD", region=region.name, crd=name) from err
    return names


def crds_established(api: k8s.ApiClient, names: list[str]) -> bool:
    extensions = k8s.ApiextensionsV1Api(api)
    for name in names:
        try:
            crd = extensions.read_custom_resource_definition(
                name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except (ApiException, Urllib3Error):
            return False
        conditions = (crd.status.conditions if crd.status else None) or []
        if not any(c.type == "Established" and c.status == "True" for c in conditions):
            return False
    return True


def node_object(region: Region, name: str) -> dict[str, Any]:
    """A fake GPU node of ``region`` for kwok to run (status is kept on create for nodes)."""
    resources = {
        "cpu": NODE_CPU,
        "memory": NODE_MEMORY,
        "pods": NODE_PODS,
        GPU_RESOURCE: str(region.gpus_per_node),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "type": "kwok",
                REGION_LABEL: region.name,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "fake-gpu",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": [dict(FAKE_NODE_TAINT)]},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def create_nodes(api: k8s.ApiClient, region: Region) -> list[str]:
    """Create the region's fake GPU nodes (existing ones are kept)."""
    core = k8s.CoreV1Api(api)
    names = region.node_names()
    for name in names:
        try:
            core.create_node(
                cast(Any, node_object(region, name)), _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            if err.status != 409:
                raise _kube_error(err, "creating a node", region=region.name, node=name) from err
    return names


def schedulable_nodes(api: k8s.ApiClient, region: Region) -> tuple[int, int]:
    """(nodes Ready and without the not-ready taint, nodes of this region)."""
    core = k8s.CoreV1Api(api)
    nodes = core.list_node(
        label_selector=f"{REGION_LABEL}={region.name}", _request_timeout=REQUEST_TIMEOUT_S
    ).items
    ready = 0
    for node in nodes:
        conditions = (node.status.conditions if node.status else None) or []
        is_ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        taints = (node.spec.taints if node.spec else None) or []
        if is_ready and not any(t.key == NOT_READY_TAINT for t in taints):
            ready += 1
    return ready, len(nodes)


def bootstrap(region: Region, timeout_s: float = 60.0) -> None:
    """Apply the CRDs and create the nodes; wait until the CRDs are Established."""
    with api_client(region) as api:
        crds = apply_crds(api, region)
        create_nodes(api, region)
        wait_for(
            lambda: crds_established(api, crds),
            "hotload's CRDs to be Established",
            timeout_s,
            region=region.name,
        )
    log.info("bootstrapped", extra={"region": region.name, "crds": crds, "nodes": region.nodes})


def wait_nodes_schedulable(region: Region, timeout_s: float = 90.0) -> None:
    """Wait until every fake node is Ready and its not-ready taint is gone."""

    def all_ready() -> bool:
        try:
            ready, total = schedulable_nodes(api, region)
        except (ApiException, Urllib3Error):
            return False
        return total == region.nodes and ready == total

    with api_client(region) as api:
        wait_for(all_ready, f"{region.nodes} fake nodes to be Ready", timeout_s, region=region.name)
