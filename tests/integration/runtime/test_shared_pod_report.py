"""A replica's report of a delta is one pod write, and another writer's edit is undone
within seconds, without reading the pod back on a timer.

Three shared-mode pods (the real sidecar agent, ``noop`` engine) of one RolloutDeployment
on a real region; targets moved by hand (no operator watches ``rt-*``). A client watches
the pods and records every change of what the sidecar writes (its ``hotload.dev/*``
annotations and the ``hotload.dev/SnapshotReady`` condition). Would catch: a delta
reported as ``Loading`` then ``Ready`` (two writes; three with the condition in a patch of
its own), the report split over ``pods`` and ``pods/status``, a foreign edit repaired only
at the next periodic read (~10 s), and sidecars reading their pods back on a timer.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api.pod import ANNOTATION_PREFIX, CONDITION_SNAPSHOT_READY
from hotload.local import LocalRegions, Region
from tests.integration.operator.tiny_chain import TinyChain, TinySnapshot
from tests.integration.runtime.conftest import wait_for
from tests.integration.runtime.shared_fleet import install_shared_deployment, shared_pod

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

PODS = 3
DEPLOYMENT = "onewrite"
DELTAS = 3
REPAIR_LIMIT_S = 5.0

Report = tuple[tuple[tuple[str, str], ...], str | None]
"""The sidecar's part of a pod: its annotations (sorted) and its condition's status."""


def report_of(pod: dict[str, Any]) -> Report:
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    ours = tuple(sorted((k, v) for k, v in notes.items() if k.startswith(ANNOTATION_PREFIX)))
    gate = next(
        (
            c.get("status")
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") == CONDITION_SNAPSHOT_READY
        ),
        None,
    )
    return ours, gate


@dataclass
class ReportWatch:
    """Every change of each pod's report, as a watching client sees it."""

    core: Any
    """The admin's CoreV1Api (Any: raw watch lines, untyped there)."""
    namespace: str
    changes: dict[str, list[tuple[float, Report]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        version = self.core.list_namespaced_pod(self.namespace).metadata.resource_version
        while not self.stop.is_set():
            response = self.core.list_namespaced_pod(
                self.namespace, watch=True, resource_version=version, timeout_seconds=5,
                allow_watch_bookmarks=True, _preload_content=False,
            )  # fmt: skip
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self._see(obj)

    def _see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        report = report_of(pod)
        with self.lock:
            seen = self.changes.setdefault(name, [])
            if not seen or seen[-1][1] != report:
                seen.append((time.monotonic(), report))

    def since(self, name: str, moment: float) -> list[tuple[float, Report]]:
        with self.lock:
            return [c for c in self.changes.get(name, []) if c[0] >= moment]

    def latest(self, name: str) -> Report | None:
        with self.lock:
            seen = self.changes.get(name)
            return seen[-1][1] if seen else None


@pytest.fixture
def watch(core: k8s.CoreV1Api, module_namespace: str) -> Iterator[ReportWatch]:
    watcher = ReportWatch(core, module_namespace)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    yield watcher
    watcher.stop.set()
    thread.join(timeout=15)


def _state(report: Report | None) -> tuple[str | None, str | None]:
    notes = dict(report[0]) if report else {}
    return notes.get("hotload.dev/snapshot"), notes.get("hotload.dev/state")


def _apiserver_pod_gets(api: k8s.ApiClient) -> float:
    """GETs of single pods the API server has answered so far (its own /metrics)."""
    client: Any = api
    response = client.call_api("GET", f"{api.configuration.host}/metrics")
    response.read()
    total = 0.0
    for line in response.data.decode().splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'resource="pods"' in line
            and 'verb="GET"' in line
            and 'scope="resource"' in line
            and 'subresource=""' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_delta_is_one_write_and_a_foreign_edit_is_undone_within_seconds(
    operated_regions: LocalRegions,  # the operator's Lease exists (the fencing policy's param)
    core: k8s.CoreV1Api,
    kube_clients: dict[str, k8s.ApiClient],
    region: Region,
    module_namespace: str,
    tmp_path: Path,
    watch: ReportWatch,
) -> None:
    ns, api = module_namespace, kube_clients[region.name]
    chain = TinyChain(tmp_path / "bucket", tmp_path / "work", name="one")
    (tmp_path / "bucket").mkdir()
    full = asyncio.run(chain.publish(0, full=True))
    deployment = install_shared_deployment(
        api, ns, DEPLOYMENT, bucket=tmp_path / "bucket", replicas=PODS, target=_target(full)
    )
    names = [f"{DEPLOYMENT}-{n}" for n in range(PODS)]
    for name in names:
        core.create_namespaced_pod(ns, shared_pod(deployment, name))  # type: ignore[arg-type]

    def everyone_at(identity: str) -> bool:
        return all(_state(watch.latest(n)) == (identity, "Ready") for n in names)

    wait_for("every pod Ready at the Full", lambda: everyone_at(full.identity), 180)

    # One write per replica per delta: the state it ends in, never Loading first.
    began = time.monotonic()
    for step in range(1, DELTAS + 1):
        delta = asyncio.run(chain.publish(step))
        _move_target(api, ns, delta)
        wait_for(f"every pod Ready at {delta.identity}", partial(everyone_at, delta.identity))
    for name in names:
        changes = watch.since(name, began)
        states = [_state(report) for _, report in changes]
        assert [s for _, s in states] == ["Ready"] * DELTAS, (name, states)
        assert len(changes) == DELTAS, f"{name}: {len(changes)} report writes for {DELTAS} deltas"

    # Nobody reads their pod back on a timer (the old writer: one GET per pod every ~10 s).
    gets = _apiserver_pod_gets(api)
    time.sleep(12)
    assert _apiserver_pod_gets(api) - gets < PODS

    # Another writer's edit of the report is undone within seconds (the watch sees it).
    victim = names[1]
    wanted = watch.latest(victim)
    edited = time.monotonic()
    core.patch_namespaced_pod(
        victim, ns,
        {"metadata": {"annotations": {"hotload.dev/snapshot": "someone-else",
                                      "hotload.dev/state": "Failed"}}},
    )  # fmt: skip
    wait_for("the edit repaired", lambda: watch.latest(victim) == wanted, 30, every=0.05)
    assert time.monotonic() - edited <= REPAIR_LIMIT_S
    forged = time.monotonic()
    core.patch_namespaced_pod_status(
        victim, ns,
        {"status": {"conditions": [{"type": CONDITION_SNAPSHOT_READY, "status": "False",
                                    "reason": "Forged"}]}},
    )  # fmt: skip
    wait_for("the forged gate repaired", lambda: watch.latest(victim) == wanted, 30, every=0.05)
    assert time.monotonic() - forged <= REPAIR_LIMIT_S


def _target(snapshot: TinySnapshot) -> dict[str, Any]:
    return {
        "identity": snapshot.identity,
        "step": snapshot.step,
        "kind": snapshot.kind.value,
        "kvCachePolicy": "all",
    }


def _move_target(api: k8s.ApiClient, namespace: str, snapshot: TinySnapshot) -> None:
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", DEPLOYMENT,
        {"status": {"targetSnapshot": _target(snapshot)}},
    )  # fmt: skip
