"""``hotload gc`` against real apiservers: what the regions' PolicySnapshots retain stays,
everything else of ours goes, and a region whose apiserver is down stops every deletion.

The unit tests (tests/unit/publish/test_garbage.py) cover the rules with stand-in
regions; this runs them through :class:`RegionClient` on the session's real control
planes, with a real outage (the region's kube-apiserver stopped). Would catch: gc
reading what is retained from anything but the regions' own objects, and an outage of
one region deleting a chain that region still replays.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api import API_VERSION, GROUP, VERSION
from hotload.api.policy_snapshot import KIND as SNAPSHOT_KIND
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import KIND as DEPLOYMENT_KIND
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.errors import GcRefused
from hotload.local import LocalRegions
from hotload.publish.garbage import collect_garbage
from hotload.publish.region_client import RegionClient
from tests.fixtures.apiserver_outage import apiserver_down

from ...unit.publish.test_garbage import (
    CHAIN,
    CHECKPOINTED,
    CHECKPOINTS,
    make_old,
    prefixes,
    psnap,
    publish_chain,
)

pytestmark = pytest.mark.cluster

DEPLOYMENT = "demo"


def _apply(api: k8s.ApiClient, namespace: str, plural: str, body: dict[str, Any]) -> None:
    k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, body
    )


def _create_deployment(api: k8s.ApiClient, namespace: str, bucket: Path) -> None:
    _apply(api, namespace, DEPLOYMENTS, {
        "apiVersion": API_VERSION, "kind": DEPLOYMENT_KIND, "metadata": {"name": DEPLOYMENT},
        "spec": {
            "model": {"name": "tiny", "servedName": "policy"}, "engine": {"kind": "noop"},
            "replicas": 0, "hotLoad": {"bucketUrl": f"file://{bucket}"},
        },
    })  # fmt: skip


def test_gc_keeps_what_real_regions_retain_and_deletes_nothing_while_one_is_down(
    tmp_path: Path,
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
) -> None:
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHAIN)
    make_old(bucket)
    up_to_date, lagging = local_regions.regions[0], local_regions.regions[1]
    retained = {
        # Its operator kept the newest Full and its delta.
        up_to_date.name: [psnap("run-step-4-full", None), psnap("run-step-5", "run-step-4-full")],
        # Only step 2's object is left: replaying it needs steps 1 and 0 as well.
        lagging.name: [psnap("run-step-2", "run-step-1")],
    }
    for name, snapshots in retained.items():
        api = kube_clients[name]
        _create_deployment(api, namespace, bucket)
        for body in snapshots:
            _apply(api, namespace, SNAPSHOTS, {"apiVersion": API_VERSION, "kind": SNAPSHOT_KIND,
                                               **body})  # fmt: skip

    def clients() -> dict[str, RegionClient]:
        kubeconfig = local_regions.kubeconfig
        return {name: RegionClient(name, kubeconfig, namespace, DEPLOYMENT) for name in retained}

    everything = {name for name, _ in CHAIN}
    with apiserver_down(lagging), pytest.raises(GcRefused) as refused:
        asyncio.run(collect_garbage(clients(), prefix="run"))
    assert lagging.name in refused.value.context["regions"]
    assert prefixes(bucket) == everything, "a region was down: nothing may go"

    result = asyncio.run(collect_garbage(clients(), prefix="run"))
    (gc,) = result.buckets
    assert sorted(gc.deleted) == ["run-step-3"]
    assert prefixes(bucket) == everything - {"run-step-3"}
    assert gc.contexts == sorted(retained)


def test_gc_stops_each_chain_at_the_checkpoint_the_regions_deltas_name(
    tmp_path: Path,
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
) -> None:
    """Would catch: ``incremental.checkpoint`` lost on its way through a real API server
    (pruned by a CRD without it: every chain would be walked back to its Full and nothing
    older than the checkpoint would ever go), and gc deleting the checkpoint it names or
    one completed but not named yet."""
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHECKPOINTED, CHECKPOINTS)
    make_old(bucket)
    first, second = local_regions.regions[0], local_regions.regions[1]
    retained = {
        first.name: [psnap("run-step-3", "run-step-2", checkpoint_of="run-step-2"),
                     psnap("run-step-4", "run-step-3", checkpoint_of="run-step-2")],
        second.name: [psnap("run-step-4", "run-step-3", checkpoint_of="run-step-2")],
    }  # fmt: skip
    for name, snapshots in retained.items():
        _create_deployment(kube_clients[name], namespace, bucket)
        for body in snapshots:
            _apply(kube_clients[name], namespace, SNAPSHOTS,
                   {"apiVersion": API_VERSION, "kind": SNAPSHOT_KIND, **body})  # fmt: skip
    clients = {
        name: RegionClient(name, local_regions.kubeconfig, namespace, DEPLOYMENT)
        for name in retained
    }
    try:
        result = asyncio.run(collect_garbage(clients, prefix="run"))
    finally:
        for client in clients.values():
            client.close()

    assert result.needed == ["run-step-2", "run-step-2-full", "run-step-3", "run-step-4"]
    (gc,) = result.buckets
    assert sorted(gc.deleted) == ["run-step-0-full", "run-step-1", "run-step-1-full"]
    assert gc.kept_recent_fulls == ["run-step-4-full"]
    assert prefixes(bucket) == {*result.needed, "run-step-4-full"}
