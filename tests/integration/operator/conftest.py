"""Fixtures of the operator's tests: a deployment in a namespace the chart's operator watches.

The operator is the one the chart installed in the session's regions (run by the pod
runtime, watching ``hl-*``); these tests never start one. Each test gets a fresh
``hl-*`` namespace (``operated_namespace``), a ``file://`` bucket, a tiny trainer
(:class:`TinyChain`) and a :class:`Rollout` that applies objects with kubectl, reads them
as JSON and waits on them with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from hotload.api import pod as contract
from hotload.local import LocalRegions
from hotload.operator.workload import label_selector
from hotload.waiting import wait_until
from tests.fixtures.cluster import Kubectl
from tests.integration.operator.tiny_chain import TinyChain, TinySnapshot

TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
DEPLOYMENT = "fleet"
#: Room for a slow shared machine: pods start, sidecars fetch and verify, the operator batches.
ROLLOUT_TIMEOUT_S = 120.0


class PodHistory:
    """Every (pod, snapshot, state) the replicas ever reported, from a watch of their pods."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str, deployment: str) -> None:
        self.seen: list[tuple[str, str | None, str | None]] = []
        self._stop = threading.Event()
        self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        self._thread = threading.Thread(
            target=self._run, args=(core, namespace, deployment), daemon=True
        )
        self._thread.start()

    def _run(self, core: k8s.CoreV1Api, namespace: str, deployment: str) -> None:
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod, namespace,
                    label_selector=label_selector(deployment), timeout_seconds=30,
                ):  # fmt: skip
                    notes = event["object"].metadata.annotations or {}
                    self.seen.append(
                        (
                            event["object"].metadata.name,
                            notes.get(contract.ANNOTATION_SNAPSHOT),
                            notes.get(contract.ANNOTATION_STATE),
                        )
                    )
                    if self._stop.is_set():
                        return
            except Exception:  # the test's own assertions say what went wrong
                if self._stop.wait(0.5):
                    return

    def served(self) -> set[str]:
        return {snapshot for _, snapshot, _ in self.seen if snapshot}

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()  # type: ignore[no-untyped-call]


class Rollout:
    """One RolloutDeployment in one region, driven the way a trainer and a user drive it."""

    def __init__(
        self, kubectl: Kubectl, api: k8s.ApiClient, region: str, namespace: str, chain: TinyChain
    ) -> None:
        self.kubectl = kubectl
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.apps = k8s.AppsV1Api(api)
        self.region = region
        self.namespace = namespace
        self.chain = chain
        self.name = DEPLOYMENT

    def run(self, *args: str, input: str | None = None, timeout: float = 60.0) -> str:
        return self.kubectl("-n", self.namespace, *args, context=self.region, input=input,
                            timeout=timeout)  # fmt: skip

    def apply(self, *documents: dict[str, Any]) -> None:
        self.run("apply", "-f", "-", input=yaml.safe_dump_all(list(documents)))

    def create(self, replicas: int, keep: int = 10, rollout: dict[str, Any] | None = None) -> None:
        """``rollout``: the deployment's ``spec.rollout`` (how it switches)."""
        spec: dict[str, Any] = {
            "model": {"name": "tiny", "servedName": "policy"},
            "engine": {"kind": "noop"},
            "replicas": replicas,
            "hotLoad": {"bucketUrl": f"file://{self.chain.bucket_dir}"},
            "scheduling": {"tolerations": [TOLERATION]},
            "retention": {"keepSnapshots": keep},
        }
        if rollout is not None:
            spec["rollout"] = rollout
        self.apply(
            {
                "apiVersion": "hotload.dev/v1alpha1",
                "kind": "RolloutDeployment",
                "metadata": {"name": self.name},
                "spec": spec,
            }
        )

    def prepare(self, step: int, *, full: bool = False, corrupt: bool = False) -> TinySnapshot:
        """Publish a snapshot to the bucket (manifest last), not applied yet."""
        snapshot = asyncio.run(self.chain.publish(step, full=full))
        if corrupt:
            self.chain.corrupt(snapshot)
        return snapshot

    def publish(self, step: int, *, full: bool = False, corrupt: bool = False) -> TinySnapshot:
        """Publish a snapshot to the bucket and apply its PolicySnapshot."""
        snapshot = self.prepare(step, full=full, corrupt=corrupt)
        self.apply(snapshot.policy_snapshot(self.name))
        return snapshot

    def checkpoint(self) -> tuple[str, str]:
        """A checkpoint of the last published snapshot, in the bucket only; later deltas
        name it: (its identity, the snapshot it is of)."""
        return asyncio.run(self.chain.checkpoint())

    def get(self, kind: str, name: str) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.run("get", kind, name, "-o", "json"))
        return body

    def snapshot(self, identity: str) -> dict[str, Any]:
        return self.get("policysnapshot", identity)

    def deployment(self) -> dict[str, Any]:
        return self.get("rolloutdeployment", self.name)

    def condition(self, body: dict[str, Any], kind: str) -> tuple[str | None, str | None]:
        for entry in (body.get("status") or {}).get("conditions") or []:
            if entry.get("type") == kind:
                return entry.get("status"), entry.get("reason")
        return None, None

    def wait_ready(self, *identities: str, timeout_s: float = ROLLOUT_TIMEOUT_S) -> None:
        """``kubectl wait --for=condition=Ready`` on each PolicySnapshot, as a user would."""
        for identity in identities:
            self.run("wait", "--for=condition=Ready", f"policysnapshot/{identity}",
                     f"--timeout={int(timeout_s)}s", timeout=timeout_s + 30)  # fmt: skip

    def wait_for(self, what: str, probe: Any, timeout_s: float = ROLLOUT_TIMEOUT_S) -> Any:
        result = wait_until(probe, timeout_s, interval_s=0.5)
        assert result, f"timed out after {timeout_s:.0f}s waiting for {what}"
        return result

    def pods(self) -> list[k8s.V1Pod]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=label_selector(self.name)
            ).items
        )

    def serving(self) -> dict[str, str | None]:
        """Pod name → the snapshot it serves (live pods only)."""
        serving: dict[str, str | None] = {}
        for pod in self.pods():
            meta = pod.metadata or k8s.V1ObjectMeta()
            if meta.deletion_timestamp is None:
                notes = meta.annotations or {}
                serving[str(meta.name)] = notes.get(contract.ANNOTATION_SNAPSHOT)
        return serving

    def all_serve(self, identity: str, replicas: int) -> bool:
        serving = self.serving()
        return len(serving) == replicas and all(s == identity for s in serving.values())

    def ledger(self, identity: str) -> dict[str, Any]:
        return dict((self.snapshot(identity).get("status") or {}).get("replicas") or {})

    def target(self) -> str | None:
        return ((self.deployment().get("status") or {}).get("targetSnapshot") or {}).get("identity")

    def events(self, name: str) -> list[dict[str, Any]]:
        raw = self.run("get", "events", "--field-selector", f"involvedObject.name={name}",
                       "-o", "json")  # fmt: skip
        return list(json.loads(raw).get("items") or [])

    def history(self) -> PodHistory:
        return PodHistory(self.core, self.namespace, self.name)


@pytest.fixture
def chain(tmp_path: Path) -> TinyChain:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    return TinyChain(bucket, tmp_path / "trainer", name="p")


@pytest.fixture
def rollout(
    operated_regions: LocalRegions,
    operated_namespace: str,
    kubectl: Kubectl,
    kube_clients: dict[str, k8s.ApiClient],
    chain: TinyChain,
) -> Iterator[Rollout]:
    """A deployment driver in the first region (the operator watches its namespace)."""
    region = operated_regions.regions[0].name
    yield Rollout(kubectl, kube_clients[region], region, operated_namespace, chain)
