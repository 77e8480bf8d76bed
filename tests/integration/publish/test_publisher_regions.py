"""The publisher against real apiservers: every region gets every snapshot, in order, from
its own bucket; a region that is down neither blocks the others nor misses anything.

Real control planes (the session's regions), real file:// buckets (one per region), real
encoded snapshots. No operator watches ``t-*`` namespaces, so where a test needs a
PolicySnapshot's conditions it writes them itself, as the operator would.
Would catch: a region's outage stalling the publish or losing snapshots, snapshots
applied out of order on catch-up, a second bucket never written, a delta on top of a
chain a region broke, a publish that reports success for a region it never reached.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api import SnapshotKind
from hotload.api.labels import DEPLOYMENT_LABEL
from hotload.local import LocalRegions
from hotload.publish import Publisher, PublisherSettings, RegionOutcome
from hotload.snapshot import FORMAT, MANIFEST_NAME
from tests.fixtures.apiserver_outage import apiserver_down
from tests.fixtures.hotload_cli import hotload

from ...unit.snapshot.models import base_tensors, next_step, write_model

pytestmark = pytest.mark.cluster

DEPLOYMENT = "pub"


def deployment(bucket: Path) -> dict[str, Any]:
    return {
        "apiVersion": "hotload.dev/v1alpha1",
        "kind": "RolloutDeployment",
        "metadata": {"name": DEPLOYMENT},
        "spec": {
            "model": {"name": "tiny", "servedName": "policy"},
            "engine": {"kind": "noop"},
            "replicas": 0,
            "hotLoad": {"bucketUrl": f"file://{bucket}"},
        },
    }


@pytest.fixture
def buckets(
    tmp_path: Path,
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
) -> dict[str, Path]:
    """A RolloutDeployment in every region, each naming its own bucket."""
    found = {}
    for name in local_regions.names:
        bucket = tmp_path / f"bucket-{name}"
        bucket.mkdir()
        k8s.CustomObjectsApi(kube_clients[name]).create_namespaced_custom_object(
            "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", deployment(bucket)
        )
        found[name] = bucket
    return found


@pytest.fixture
def weights(tmp_path: Path) -> Iterator[list[Path]]:
    """Model directories of successive training steps."""
    tensors = base_tensors()
    steps = []
    for step in range(6):
        tensors = next_step(tensors, seed=step)
        steps.append(
            write_model(tmp_path / "train" / f"step-{step}", {"model.safetensors": tensors})
        )
    yield steps


@dataclass(frozen=True)
class Scene:
    """The session's regions with a RolloutDeployment each, and trained weights."""

    regions: LocalRegions
    clients: dict[str, k8s.ApiClient]
    namespace: str
    buckets: dict[str, Path]
    weights: list[Path]
    workdir: Path


@pytest.fixture
def scene(
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
    buckets: dict[str, Path],
    weights: list[Path],
    tmp_path: Path,
) -> Scene:
    return Scene(local_regions, kube_clients, namespace, buckets, weights, tmp_path / "work")


def settings(scene: Scene, **overrides: Any) -> PublisherSettings:
    return PublisherSettings(
        deployment=DEPLOYMENT,
        contexts=tuple(scene.regions.names),
        workdir=scene.workdir,
        namespace=scene.namespace,
        kubeconfig=scene.regions.kubeconfig,
        identity_prefix="run",
        **overrides,
    )


def snapshots(api: k8s.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """Every PolicySnapshot of the namespace, by name."""
    listed: dict[str, Any] = k8s.CustomObjectsApi(api).list_namespaced_custom_object(
        "hotload.dev", "v1alpha1", namespace, "policysnapshots"
    )
    return {item["metadata"]["name"]: item for item in listed["items"]}


def snapshot_names(api: k8s.ApiClient, namespace: str) -> list[str]:
    return sorted(snapshots(api, namespace))


def test_full_then_delta_reach_every_region_and_its_own_bucket(scene: Scene) -> None:
    with Publisher(settings(scene)) as publisher:
        full = publisher.publish(scene.weights[0], 0).result(timeout=120)
        delta = publisher.publish(scene.weights[1], 1).result(timeout=120)

    assert (full.identity, full.kind, full.why) == ("run-step-0-full", SnapshotKind.FULL, "first")
    assert (delta.identity, delta.kind, delta.previous) == (
        "run-step-1",
        SnapshotKind.INCREMENTAL,
        "run-step-0-full",
    )
    assert delta.stored_bytes < full.stored_bytes
    for result in (full, delta):
        assert {r.outcome for r in result.regions.values()} == {RegionOutcome.APPLIED}
        for name, bucket in scene.buckets.items():
            assert (bucket / result.identity / MANIFEST_NAME).is_file()
            assert result.regions[name].uploaded_bytes > 0
    for name in scene.regions.names:
        assert snapshot_names(scene.clients[name], scene.namespace) == [
            "run-step-0-full",
            "run-step-1",
        ]
        raw = snapshots(scene.clients[name], scene.namespace)["run-step-1"]
        assert raw["metadata"]["labels"][DEPLOYMENT_LABEL] == DEPLOYMENT
        assert raw["spec"]["incremental"]["previousIdentity"] == "run-step-0-full"
        assert raw["spec"]["incremental"]["compressionFormat"] == FORMAT


def test_a_region_that_is_down_gets_its_snapshots_in_order_when_back(scene: Scene) -> None:
    up, down = scene.regions.names
    with Publisher(settings(scene)) as publisher:
        publisher.publish(scene.weights[0], 0).result(timeout=120)
        with apiserver_down(scene.regions.region(down)):
            began = time.monotonic()
            during = [publisher.publish(scene.weights[s], s).result(timeout=120) for s in (1, 2)]
            spent = time.monotonic() - began
            assert publisher.pending() == {down: ["run-step-1", "run-step-2"]}
        # The region that answered was not held up by the one that did not.
        assert spent < 60
        for result in during:
            assert result.regions[up].outcome is RegionOutcome.APPLIED
            assert result.regions[down].outcome is RegionOutcome.PENDING
            assert "unreachable" in (result.regions[down].error or "")
        assert during[1].regions[down].pending == ["run-step-1", "run-step-2"]
        assert snapshot_names(scene.clients[up], scene.namespace) == [
            "run-step-0-full",
            "run-step-1",
            "run-step-2",
        ]
        # Back: the next publish delivers the backlog first, in order, then its own.
        after = publisher.publish(scene.weights[3], 3).result(timeout=120)
        assert after.regions[down].outcome is RegionOutcome.APPLIED
        assert after.regions[down].caught_up == ["run-step-1", "run-step-2"]
        assert publisher.pending() == {}
    assert snapshot_names(scene.clients[down], scene.namespace) == [
        "run-step-0-full",
        "run-step-1",
        "run-step-2",
        "run-step-3",
    ]
    created = {
        name: item["metadata"]["creationTimestamp"]
        for name, item in snapshots(scene.clients[down], scene.namespace).items()
    }
    assert created["run-step-1"] <= created["run-step-2"] <= created["run-step-3"]
    for identity in ("run-step-1", "run-step-2", "run-step-3"):
        assert (scene.buckets[down] / identity / MANIFEST_NAME).is_file()


def _play_operator(
    api: k8s.ApiClient, namespace: str, identity: str, condition: dict[str, str]
) -> threading.Thread:
    """Set a condition on a PolicySnapshot as soon as it exists (what the operator does)."""

    def run() -> None:
        custom = k8s.CustomObjectsApi(api)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                custom.patch_namespaced_custom_object_status(
                    "hotload.dev", "v1alpha1", namespace, "policysnapshots", identity,
                    {"status": {"conditions": [{
                        **condition, "lastTransitionTime": "2026-01-01T00:00:00Z", "message": "",
                    }], "readyReplicas": 2, "desiredReplicas": 2}},
                )  # fmt: skip
                return
            except k8s.ApiException as err:
                if err.status != 404:
                    raise
                time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_reports_ready_and_a_broken_chain_brings_a_full_at_once(scene: Scene) -> None:
    first, second = scene.regions.names
    ready = {"type": "Ready", "status": "True", "reason": "Rolled"}
    broken = {"type": "ChainValid", "status": "False", "reason": "ChecksumMismatch"}
    with Publisher(settings(scene, wait=True, wait_timeout_s=60)) as publisher:
        threads = [
            _play_operator(scene.clients[name], scene.namespace, "run-step-0-full", ready)
            for name in (first, second)
        ]
        full = publisher.publish(scene.weights[0], 0).result(timeout=120)
        assert {r.outcome for r in full.regions.values()} == {RegionOutcome.READY}
        assert all(r.ready_seconds is not None for r in full.regions.values())

        threads += [
            _play_operator(scene.clients[first], scene.namespace, "run-step-1", ready),
            _play_operator(scene.clients[second], scene.namespace, "run-step-1", broken),
            _play_operator(scene.clients[first], scene.namespace, "run-step-1-full", ready),
            _play_operator(scene.clients[second], scene.namespace, "run-step-1-full", ready),
        ]
        delta = publisher.publish(scene.weights[1], 1).result(timeout=120)
        for thread in threads:
            thread.join(timeout=60)

    assert delta.regions[first].outcome is RegionOutcome.READY
    assert delta.regions[second].outcome is RegionOutcome.CHAIN_BROKEN
    assert "ChecksumMismatch" in (delta.regions[second].error or "")
    assert delta.fallback is not None
    assert (delta.fallback.identity, delta.fallback.kind, delta.fallback.why) == (
        "run-step-1-full",
        SnapshotKind.FULL,
        "chain-broken",
    )
    assert delta.fallback.step == 1
    assert {r.outcome for r in delta.fallback.regions.values()} == {RegionOutcome.READY}
    assert delta.ok


def test_the_cli_publishes_directories_that_chain_and_gc_keeps_what_regions_need(
    scene: Scene,
) -> None:
    contexts = [part for name in scene.regions.names for part in ("--context", name)]
    common = ["-d", DEPLOYMENT, "-n", scene.namespace, "--prefix", "cli", *contexts]
    workdir = ["--workdir", str(scene.workdir)]
    answers = []
    for step in (0, 1):
        done = hotload(
            "publish", str(scene.weights[step]), "--step", str(step), *common, *workdir,
            "-o", "json", kubeconfig=scene.regions.kubeconfig,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    full, delta = answers
    assert (full["identity"], full["kind"], full["why"]) == ("cli-step-0-full", "Full", "first")
    assert (delta["identity"], delta["kind"], delta["previous"]) == (
        "cli-step-1",
        "Incremental",
        "cli-step-0-full",
    )
    assert {r["outcome"] for r in delta["regions"].values()} == {"Applied"}
    assert delta["storedBytes"] < full["storedBytes"]

    # A step older than the last is refused: a usage error, named, nothing published.
    stale = hotload(
        "publish", str(scene.weights[2]), "--step", "0", *common, *workdir,
        kubeconfig=scene.regions.kubeconfig,
    )  # fmt: skip
    assert stale.returncode != 0 and "forward" in stale.stderr

    # Both snapshots are retained in every region: gc keeps them all.
    gc = hotload(
        "gc", *common, "--min-age", "0", "--dry-run", "-o", "json",
        kubeconfig=scene.regions.kubeconfig,
    )  # fmt: skip
    assert gc.returncode == 0, gc.stderr
    plan = json.loads(gc.stdout)
    assert plan["needed"] == ["cli-step-0-full", "cli-step-1"]
    assert all(bucket["deleted"] == [] for bucket in plan["buckets"])
    assert len(plan["buckets"]) == len(scene.regions.names)
