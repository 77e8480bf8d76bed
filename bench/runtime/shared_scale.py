"""Scale benchmark of the pod runtime's shared mode: N replicas (default 1,000) in one region.

What it does, on a region of its own (its own state directory, torn down at the end):

1. ``hotload local up`` one region with enough fake nodes (256 pods each);
2. a RolloutDeployment with the ``noop`` engine and a ``file://`` bucket holding a tiny
   Full snapshot as its target, and the sidecar's RBAC and a StatefulSet of N pods as the
   operator's workload renderer makes them (the ``noop`` engine marks the pods
   ``hotload.dev/runtime: shared``: the sidecar and ``hotload engine noop``);
3. waits until every pod reports on itself: the real sidecar agent (one asyncio task per
   pod in the deployment's host process, each with its own pod-bound token and metrics
   registry) loaded the target and wrote ``hotload.dev/state: Ready`` and
   ``hotload.dev/SnapshotReady=True``, and the runtime turned the pod Ready;
4. samples the resident memory (VmRSS) of the runtime and of the host process(es) every
   two seconds, and writes the timings and memory to a results file beside the command
   that produced it.

Run (from the repository root, with the project's venv)::

    python bench/runtime/shared_scale.py --pods 1000

Not part of the test suite (CONTRACTS.md: 1,000-pod runs are bench scripts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kubernetes import client as k8s  # noqa: E402

from hotload.api.pod import (  # noqa: E402
    ANNOTATION_SNAPSHOT,
    ANNOTATION_STATE,
    CONDITION_SNAPSHOT_READY,
)
from hotload.errors import RegionIndexTaken  # noqa: E402
from hotload.local import LocalRegions, Region, down, up  # noqa: E402
from hotload.local import processes as region_processes  # noqa: E402
from hotload.local.bootstrap import api_client  # noqa: E402
from hotload.local.runtime import PROCESS_NAME  # noqa: E402
from hotload.local.runtime.launcher import settings_for  # noqa: E402
from hotload.local.runtime.process_ledger import ProcessLedger  # noqa: E402
from hotload.waiting import wait_until  # noqa: E402
from tests.integration.runtime.shared_fleet import (  # noqa: E402
    create_stateful_set,
    install_shared_deployment,
)
from tests.integration.runtime.tiny_snapshot import publish_tiny_full  # noqa: E402

NAMESPACE = "scale"
DEPLOYMENT = "fleet"
PODS_PER_NODE = 256


def log(message: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples the RSS of the runtime and its shared hosts every ``every`` seconds."""

    def __init__(self, pids: Callable[[], dict[str, int]], every: float = 2.0) -> None:
        self._pids = pids
        self._every = every
        self._stop = threading.Event()
        self.peak: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.peak_total = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = {name: rss_mib(pid) for name, pid in self._pids().items()}
            current = {name: value for name, value in sample.items() if value is not None}
            if current:
                self.last = current
                for name, value in current.items():
                    self.peak[name] = max(self.peak.get(name, 0.0), value)
                self.peak_total = max(self.peak_total, sum(current.values()))
            self._stop.wait(self._every)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def bring_up(state: Path, nodes: int) -> LocalRegions:
    for base in range(211, 250):
        try:
            return up(["scale"], state_dir=state, index_base=base, nodes=nodes, gpus_per_node=8)
        except RegionIndexTaken:
            continue
    raise SystemExit("no free address index for the benchmark region")


def create_workload(api: k8s.ApiClient, bucket: Path, target: dict[str, Any], pods: int) -> None:
    """The deployment, its sidecar RBAC and StatefulSet, as the operator's renderer makes them."""
    k8s.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
    deployment = install_shared_deployment(
        api, NAMESPACE, DEPLOYMENT, bucket=bucket, replicas=pods, target=target
    )
    create_stateful_set(api, NAMESPACE, deployment)


def census(api: k8s.ApiClient, identity: str) -> dict[str, int]:
    """How many pods exist, are scheduled, run, reported Ready on themselves, are Ready."""
    response = k8s.CoreV1Api(api).list_namespaced_pod(NAMESPACE, _preload_content=False)
    items = json.loads(response.data)["items"]
    counts = {"pods": len(items), "scheduled": 0, "running": 0, "reported": 0, "ready": 0}
    for pod in items:
        status = pod.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        annotations = pod["metadata"].get("annotations") or {}
        counts["scheduled"] += bool(pod["spec"].get("nodeName"))
        counts["running"] += status.get("phase") == "Running"
        counts["reported"] += (
            annotations.get(ANNOTATION_STATE) == "Ready"
            and annotations.get(ANNOTATION_SNAPSHOT) == identity
            and conditions.get(CONDITION_SNAPSHOT_READY) == "True"
        )
        counts["ready"] += conditions.get("Ready") == "True"
    return counts


def process_pids(region: Region) -> dict[str, int]:
    pids: dict[str, int] = {}
    for record in region_processes.read_records(region.pids_dir):
        if record.name == PROCESS_NAME:
            pids["runtime"] = record.pid
    for entry in ProcessLedger(settings_for(region).processes_dir).entries():
        if entry.key.startswith("host-"):
            pids[entry.key] = entry.pid
    return pids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=1800.0, help="Seconds to wait for all.")
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    results_path = (
        args.results or REPO / "bench" / "runtime" / "results" / f"shared-{args.pods}.json"
    )
    nodes = max(1, -(-args.pods // (PODS_PER_NODE - 16)))
    work = Path(tempfile.mkdtemp(prefix="hotload-bench-runtime-"))
    state = work / "state"
    began = time.monotonic()
    log(f"bringing up one region with {nodes} fake nodes (state {state})")
    regions = bring_up(state, nodes)
    region = regions.regions[0]
    up_s = time.monotonic() - began
    timeline: list[dict[str, Any]] = []
    outcome = "incomplete"
    marks: dict[str, float] = {}
    settle_rss: dict[str, float] = {}
    steady_rss: dict[str, float] = {}
    sampler = RssSampler(lambda: process_pids(region))
    try:
        ref = asyncio.run(publish_tiny_full(work / "bucket", work / "snapshots", "tiny-step-1", 1))
        target = ref.model_dump(mode="json", by_alias=True)
        with api_client(region) as api, sampler:
            started = time.monotonic()
            create_workload(api, work / "bucket", target, args.pods)

            def all_marked() -> bool:
                counts = census(api, ref.identity)
                elapsed = time.monotonic() - started
                timeline.append({"t": round(elapsed, 1), **counts, "rss_mib": dict(sampler.last)})
                for key in ("scheduled", "running", "reported", "ready"):
                    if counts[key] >= args.pods and key not in marks:
                        marks[key] = round(elapsed, 1)
                rss = {k: round(v) for k, v in sampler.last.items()}
                log(f"t={elapsed:6.1f}s {counts} rss_mib={rss}")
                return len(marks) == 4

            if wait_until(all_marked, args.timeout, interval_s=5.0):
                outcome = "complete"
            settle_rss = dict(sampler.last)
            time.sleep(6.0)  # one more quiet sample of the steady state
            steady_rss = dict(sampler.last)
    finally:
        down_began = time.monotonic()
        down(state)
        down_s = time.monotonic() - down_began
    result = {
        "benchmark": "pod runtime, shared mode (sidecar agents as tasks, noop engine)",
        "command": " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "pods": args.pods,
        "nodes": nodes,
        "outcome": outcome,
        "seconds": {
            "region_up": round(up_s, 1),
            "all_scheduled": marks.get("scheduled"),
            "all_running": marks.get("running"),
            "all_reported_on_their_pods": marks.get("reported"),
            "all_ready": marks.get("ready"),
            "down": round(down_s, 1),
        },
        "rss_mib": {
            "peak_by_process": {k: round(v, 1) for k, v in sampler.peak.items()},
            "peak_total": round(sampler.peak_total, 1),
            "when_all_ready": {k: round(v, 1) for k, v in settle_rss.items()},
            "steady": {k: round(v, 1) for k, v in steady_rss.items()},
        },
        "timeline": timeline,
    }
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(result, indent=2) + "\n")
    log(f"{outcome}: results in {results_path}")
    if outcome != "complete":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
