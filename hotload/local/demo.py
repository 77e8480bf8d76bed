"""The main job on the embedded default: local regions, a ``file://`` bucket, the reference
engine. Publish snapshots and watch every replica in every region become ready.

What it does, in order:

1. brings the local regions up (or reuses them), one real control plane per region;
2. in each region applies a RolloutDeployment and its workload (StatefulSet, Service,
   sidecar RBAC, rendered by ``hotload.operator.workload``): the pod runtime runs every
   replica's real ``hotload engine reference`` and ``hotload sidecar`` processes;
3. trains the reference model for real, publishes a Full snapshot and then deltas to the
   bucket (manifest last), applies each PolicySnapshot to every region and moves each
   deployment's ``status.targetSnapshot`` (the operator's job, until it lands);
4. waits, with a deadline, until every replica in every region reports the snapshot
   verified and served (its pod's ``hotload.dev/state`` and ``snapshot`` annotations), and
   prints how long each region took and how many bytes each snapshot stored;
5. asks each region's Service for a completion and shows which policy answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import kubernetes.client
import yaml

from hotload.api import KvCachePolicy, RolloutDeployment
from hotload.api import pod as contract
from hotload.errors import LocalRegionError
from hotload.kube.client import sync_api_client
from hotload.local import lifecycle as local_regions
from hotload.local.region import Region, default_names
from hotload.local.runtime.service_ports import read_ports
from hotload.local.tools import kubectl_path
from hotload.local.trainer import PolicyTrainer, PublishedSnapshot
from hotload.operator.workload import label_selector, render_workload
from hotload.storage import open_storage
from hotload.waiting import wait_until

log = logging.getLogger(__name__)

DEPLOYMENT: Final = "demo"
SERVED_NAME: Final = "policy"
POLL_S: Final = 0.5


@dataclass(frozen=True)
class DemoSettings:
    regions: int = 2
    replicas: int = 2
    deltas: int = 4
    """Deltas published after the first Full."""
    namespace: str = "hotload-demo"
    state_dir: Path | None = None
    index_base: int = 1
    size: str = "tiny"
    lr: float = 1e-5
    ready_timeout_s: float = 300.0


@dataclass
class RolloutTiming:
    snapshot: PublishedSnapshot
    seconds_by_region: dict[str, float] = field(default_factory=dict)


@dataclass
class DemoResult:
    timings: list[RolloutTiming] = field(default_factory=list)
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Region → (the ``model`` a completion named, its ``x-hotload-policy`` header)."""


class RegionSession:
    """One region as the demo drives it: kubectl for applies, the API for waits."""

    def __init__(self, region: Region, namespace: str) -> None:
        self.region = region
        self.namespace = namespace
        self._api = sync_api_client(region.kubeconfig, context=region.context)
        self.core = kubernetes.client.CoreV1Api(self._api)
        self.custom = kubernetes.client.CustomObjectsApi(self._api)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        command = [
            str(kubectl_path()),
            "--kubeconfig", str(self.region.kubeconfig),
            "--context", self.region.context,
            *args,
        ]  # fmt: skip
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LocalRegionError(
                "kubectl failed",
                region=self.region.name,
                args=" ".join(args),
                stderr=done.stderr.strip(),
            )
        return done.stdout

    def apply(self, *objects: dict[str, Any]) -> None:
        documents = yaml.safe_dump_all(list(objects), sort_keys=False)
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=hotload-demo",
            "-n", self.namespace, "-f", "-",
            stdin=documents,
        )  # fmt: skip

    def deployment(self) -> RolloutDeployment:
        raw = self.custom.get_namespaced_custom_object(
            "hotload.dev", "v1alpha1", self.namespace, "rolloutdeployments", DEPLOYMENT
        )
        return RolloutDeployment.model_validate(raw)

    def move_target(self, snapshot: PublishedSnapshot, policy: KvCachePolicy) -> None:
        """What the operator will do: point the deployment at the new snapshot."""
        ref = snapshot.manifest(DEPLOYMENT).spec.ref(policy)
        self.custom.patch_namespaced_custom_object_status(
            "hotload.dev", "v1alpha1", self.namespace, "rolloutdeployments", DEPLOYMENT,
            {"status": {"targetSnapshot": ref.to_k8s()}},
        )  # fmt: skip

    def record_current(
        self, snapshot: PublishedSnapshot, policy: KvCachePolicy, replicas: int
    ) -> None:
        """Also the operator's job: once every replica serves the target, it is current."""
        ref = snapshot.manifest(DEPLOYMENT).spec.ref(policy)
        counts = {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas}
        self.custom.patch_namespaced_custom_object_status(
            "hotload.dev", "v1alpha1", self.namespace, "rolloutdeployments", DEPLOYMENT,
            {"status": {"currentSnapshot": ref.to_k8s(), **counts}},
        )  # fmt: skip

    def replicas_serving(self, identity: str) -> tuple[int, list[str]]:
        """How many replicas serve ``identity`` verified and are Ready; the others' problems."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=label_selector(DEPLOYMENT)
        ).items
        serving, problems = 0, []
        for pod in pods:
            metadata = pod.metadata or kubernetes.client.V1ObjectMeta()
            notes = metadata.annotations or {}
            if (
                notes.get(contract.ANNOTATION_SNAPSHOT) == identity
                and notes.get(contract.ANNOTATION_STATE) == "Ready"
                and _pod_ready(pod)
            ):
                serving += 1
            elif notes.get(contract.ANNOTATION_STATE) == "Failed":
                problems.append(
                    f"{metadata.name}: {notes.get(contract.ANNOTATION_REASON)}: "
                    f"{notes.get(contract.ANNOTATION_MESSAGE)}"
                )
        return serving, problems

    def service_port(self) -> int | None:
        ports = read_ports(self.region.services_file)
        return ports.get(f"{self.namespace}/{DEPLOYMENT}", {}).get("http")


def _pod_ready(pod: kubernetes.client.V1Pod) -> bool:
    """Ready as the pod runtime says: containers ready and the readiness gate True, so the
    region's Service routes to it."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _run_id() -> str:
    """A short, DNS-safe, time-ordered id for one demo run."""
    return format(int(time.time()) % 36**6, "x")


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    if not wait_until(check, timeout_s, interval_s=POLL_S):
        raise LocalRegionError(f"timed out waiting for {what}", timeout_s=timeout_s)
    return time.monotonic() - started


def _deployment_manifest(bucket: Path, replicas: int) -> dict[str, Any]:
    example = RolloutDeployment.model_validate(
        {
            "metadata": {"name": DEPLOYMENT},
            "spec": {
                "model": {"name": "hotload-tiny-qwen2", "servedName": SERVED_NAME},
                "engine": {"kind": "reference", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                "replicas": replicas,
                "hotLoad": {
                    "bucketUrl": f"file://{bucket}",
                    "transition": "ASYNC",
                    "kvCachePolicy": "new_session",
                },
                "scheduling": {
                    "tolerations": [
                        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
                    ]
                },
            },
        }
    )
    return example.to_k8s()


def _install(session: RegionSession, bucket: Path, replicas: int) -> None:
    session.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": session.namespace}}
    )
    session.apply(_deployment_manifest(bucket, replicas))
    deployment = session.deployment()
    session.apply(*render_workload(deployment))


async def _ask_front(port: int) -> tuple[str, str]:
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": SERVED_NAME, "prompt": "A trainer publishes", "max_tokens": 12},
        )
        response.raise_for_status()
        return response.json()["model"], response.headers.get(contract.POLICY_HEADER, "")


def run_demo(settings: DemoSettings, say: Callable[[str], None] = print) -> DemoResult:
    """Run the whole demo: how long every snapshot took to reach every region, and who answered."""
    names = default_names(settings.regions)
    say(f"bringing up {settings.regions} local regions (real etcd, kube-apiserver, kwok) …")
    regions = local_regions.up(names, state_dir=settings.state_dir, index_base=settings.index_base)
    sessions = [RegionSession(regions.region(name), settings.namespace) for name in names]
    bucket = regions.state_dir / "demo-bucket"
    bucket.mkdir(parents=True, exist_ok=True)
    for session in sessions:
        _install(session, bucket, settings.replicas)
        say(f"{session.region.name}: RolloutDeployment/{DEPLOYMENT}, {settings.replicas} replicas")

    storage = open_storage(f"file://{bucket}")
    # Each run names its snapshots afresh: replicas left from an earlier run must never take
    # a new snapshot for one they already hold under the same name.
    run = _run_id()
    trainer = PolicyTrainer(
        regions.state_dir / "demo-trainer" / run,
        storage,
        name=f"{DEPLOYMENT}-{run}",
        size=settings.size,
        lr=settings.lr,
    )
    result = DemoResult()
    for number in range(settings.deltas + 1):
        if number:
            trainer.train_step()
        snapshot = asyncio.run(trainer.publish(full=number == 0))
        result.timings.append(_roll_out(sessions, snapshot, settings, say))

    for session in sessions:
        port = session.service_port()
        if port is None:
            say(f"{session.region.name}: no local Service port yet")
            continue
        model, policy = asyncio.run(_ask_front(port))
        result.answers[session.region.name] = (model, policy)
        say(
            f"{session.region.name}: 127.0.0.1:{port} answered as model={model} "
            f"({contract.POLICY_HEADER}: {policy})"
        )
    say(
        f"done. Look around: kubectl --kubeconfig {regions.kubeconfig} get rd,psnap,pods -A\n"
        "stop with: hotload local down"
    )
    return result


def _roll_out(
    sessions: Sequence[RegionSession],
    snapshot: PublishedSnapshot,
    settings: DemoSettings,
    say: Callable[[str], None],
) -> RolloutTiming:
    timing = RolloutTiming(snapshot)
    say(
        f"published {snapshot.identity} ({snapshot.kind.value}, step {snapshot.step}"
        + (f", loss {snapshot.loss:.3f}" if snapshot.step else "")
        + f"): {snapshot.stored_bytes:,} bytes stored"
        + (f", {snapshot.ratio:.0f}x smaller than the full weights" if snapshot.previous else "")
    )
    started = time.monotonic()
    for session in sessions:
        session.apply(snapshot.manifest(DEPLOYMENT).to_k8s())
        session.move_target(snapshot, KvCachePolicy.NEW_SESSION)
    for session in sessions:

        def all_serving(session: RegionSession = session) -> bool:
            serving, problems = session.replicas_serving(snapshot.identity)
            if problems:
                raise LocalRegionError(
                    "replicas failed to load the snapshot",
                    region=session.region.name,
                    problems="; ".join(problems),
                )
            return serving == settings.replicas

        _wait(
            f"{snapshot.identity} on every replica of {session.region.name}",
            all_serving,
            settings.ready_timeout_s,
        )
        timing.seconds_by_region[session.region.name] = time.monotonic() - started
        session.record_current(snapshot, KvCachePolicy.NEW_SESSION, settings.replicas)
        say(
            f"  {session.region.name}: {settings.replicas}/{settings.replicas} replicas serve "
            f"{snapshot.identity}, verified ({timing.seconds_by_region[session.region.name]:.1f} s)"
        )
    return timing


def timings_json(timings: Sequence[RolloutTiming]) -> str:
    return json.dumps(
        [
            {
                "snapshot": t.snapshot.identity,
                "kind": t.snapshot.kind.value,
                "storedBytes": t.snapshot.stored_bytes,
                "secondsByRegion": t.seconds_by_region,
            }
            for t in timings
        ],
        indent=2,
    )
