"""Propagation benchmark: apply a PolicySnapshot → every replica serves it, at 30 / 300 / 1,000.

What it does, on one region of its own (its own state directory, torn down at the end):

1. ``hotload local up`` one region with enough fake nodes, and ``helm install`` the chart
   (the operator, 2 replicas and a leader Lease, run by the pod runtime; it watches ``hl-*``);
2. per size N: a RolloutDeployment of N ``noop``-engine replicas in the runtime's shared
   mode (real sidecar agents as tasks: each fetches, verifies and rebuilds every snapshot
   from a ``file://`` bucket), a Full, then at least ten deltas (and at least 1,000
   per-replica samples), applied one at a time, each once the previous one is everywhere;
3. per snapshot, from a client watching the pods: each replica's time from the apply to
   its pod reporting the snapshot served and ``Ready`` (p50/p99 over all samples), and the
   time until the last one; the operator's status writes and API requests (its
   ``/metrics``), every client's API requests (the apiserver's ``/metrics``), the active
   operator's CPU seconds, and both operators' peak RSS;
4. the baseline, measured the same way on the same StatefulSet: a rolling restart
   (``kubectl rollout restart``): per replica, from the restart to its new pod serving
   the snapshot again. A StatefulSet replaces one pod at a time, so at 300 and 1,000 it
   measures the first ``--restart-pods`` replacements and states the projection for all.

Run (from the repository root, with the project's venv)::

    python bench/propagation/run.py --replicas 30 300 1000

Results: ``bench/propagation/results.json`` (every number, with the command) and
``bench/propagation/RESULTS.md`` (the summary table, then ``analysis.md``: how to read it,
written by hand). ``--render results.json`` rewrites RESULTS.md only. Not part of the
test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from hotload.api import API_VERSION  # noqa: E402
from hotload.api import pod as contract  # noqa: E402
from hotload.errors import RegionIndexTaken  # noqa: E402
from hotload.local import LocalRegions, Region, down, up  # noqa: E402
from hotload.local import chart as hotload_chart  # noqa: E402
from hotload.local.bootstrap import api_client  # noqa: E402
from hotload.local.processes import read_records  # noqa: E402
from hotload.local.reaper import start_reaper  # noqa: E402
from hotload.local.runtime.launcher import settings_for  # noqa: E402
from hotload.local.runtime.process_ledger import ProcessLedger  # noqa: E402
from hotload.operator.workload import label_selector  # noqa: E402
from hotload.waiting import wait_until  # noqa: E402
from tests.integration.operator.tiny_chain import TinyChain, TinySnapshot  # noqa: E402

DEPLOYMENT = "fleet"
PODS_PER_NODE = 240
MIN_SNAPSHOTS = 10
MIN_SAMPLES = 1000
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
CHART = hotload_chart.ChartRelease(watch_namespaces=("hl-*",), cluster_wide=True)
GROUP, VERSION = API_VERSION.split("/")


def log(message: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


# --- watching the pods ---------------------------------------------------------------


class PodWatcher:
    """A client watching the replicas' pods: when each pod first reported each snapshot.

    Raw JSON lines off the watch stream (decoding a thousand pods into the client's model
    objects per snapshot would cost the benchmark more CPU than the operator it measures);
    on any error it lists again from scratch.
    """

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self._core = k8s.CoreV1Api(api)
        self._namespace = namespace
        self._lock = threading.Lock()
        self.first_ready: dict[tuple[str, str, str], float] = {}
        """(pod uid, pod name, snapshot) → monotonic time it was first seen Ready at it."""
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _see(self, pod: dict[str, Any], seen: float) -> None:
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        snapshot = notes.get(contract.ANNOTATION_SNAPSHOT)
        if snapshot and notes.get(contract.ANNOTATION_STATE) == "Ready":
            with self._lock:
                self.first_ready.setdefault((meta.get("uid"), meta.get("name"), snapshot), seen)

    def _handle(self, event: dict[str, Any], version: str) -> str:
        if event.get("type") == "ERROR":
            raise RuntimeError(str(event.get("object")))
        obj = event.get("object") or {}
        if event.get("type") in ("ADDED", "MODIFIED"):
            self._see(obj, time.monotonic())
        return str(obj.get("metadata", {}).get("resourceVersion") or version)

    def _run(self) -> None:
        selector = label_selector(DEPLOYMENT)
        while not self._stop.is_set():
            try:
                listing = self._core.list_namespaced_pod(
                    self._namespace, label_selector=selector, _preload_content=False
                )
                body = json.loads(listing.data)
                seen = time.monotonic()
                for pod in body.get("items") or []:
                    self._see(pod, seen)
                version = body["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    self._response = self._core.list_namespaced_pod(
                        self._namespace, label_selector=selector, watch=True,
                        resource_version=version, allow_watch_bookmarks=True,
                        timeout_seconds=60, _preload_content=False,
                    )  # fmt: skip
                    pending = b""
                    for chunk in self._response.stream(65536, decode_content=True):
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        for line in lines:
                            if line.strip():
                                version = self._handle(json.loads(line), version)
            except Exception as err:  # a broken watch lists again from scratch
                if not self._stop.is_set():
                    log(f"pod watch restarted: {str(err).splitlines()[0][:200]}")
                self._stop.wait(0.5)

    def ready_times(self, snapshot: str) -> dict[str, float]:
        """Pod name → first time (monotonic) a pod of that name served ``snapshot``."""
        with self._lock:
            times: dict[str, float] = {}
            for (_, name, ident), seen in self.first_ready.items():
                if ident == snapshot:
                    times[name] = min(seen, times.get(name, seen))
            return times

    def ready_by_uid(self, snapshot: str) -> dict[str, tuple[str, float]]:
        with self._lock:
            return {
                uid: (name, seen)
                for (uid, name, ident), seen in self.first_ready.items()
                if ident == snapshot
            }

    def stop(self) -> None:
        self._stop.set()
        if self._response is not None:
            self._response.close()


# --- what the operator and the apiserver say -------------------------------------------


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|\+Inf)$")


def scrape(text: str) -> dict[str, float]:
    """Prometheus text → {"name{labels}": value}."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


REFUSED = 'code="429"'
"""Priority and fairness refused the request unprocessed: not a write, counted apart."""


def _requests(
    samples: dict[str, float], resource: str, verb: str, *, refused: bool = False
) -> float:
    """The API server's requests of one resource (all its subresources) and verb: those it
    processed, or (``refused``) those it answered 429 without processing."""
    return sum(
        v
        for k, v in samples.items()
        if k.startswith("apiserver_request_total{")
        and f'resource="{resource}"' in k
        and f'verb="{verb}"' in k
        and (REFUSED in k) == refused
    )


def total(samples: dict[str, float], name: str, where: str = "") -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and where in k)


@dataclass
class OperatorPod:
    name: str
    ip: str
    pid: int | None


def operator_pods(region: Region, api: k8s.ApiClient) -> list[OperatorPod]:
    pods = (
        k8s.CoreV1Api(api)
        .list_namespaced_pod(CHART.namespace, label_selector="app.kubernetes.io/component=operator")
        .items
    )
    ledger = {e.key: e.pid for e in ProcessLedger(settings_for(region).processes_dir).entries()}
    return [
        OperatorPod(
            p.metadata.name,
            p.status.pod_ip or "",
            ledger.get(f"{p.metadata.uid}.operator"),
        )
        for p in pods
        if p.metadata.deletion_timestamp is None
    ]


def operator_metrics(pod: OperatorPod) -> dict[str, float]:
    try:
        return scrape(httpx.get(f"http://{pod.ip}:8080/metrics", timeout=10).text)
    except httpx.HTTPError:
        return {}


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return math.nan
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int | None) -> float:
    if pid is None:
        return math.nan
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def component_pids(region: Region) -> dict[str, list[int]]:
    """Every process of the region by component: the control plane's own (pid files),
    the pod runtime's shared hosts and operators (its process ledger), and this one."""
    pids: dict[str, list[int]] = {"bench client": [os.getpid()]}
    for record in read_records(region.pids_dir):
        pids.setdefault(record.name, []).append(record.pid)
    for entry in ProcessLedger(settings_for(region).processes_dir).entries():
        if entry.key.startswith("host-"):
            pids.setdefault("shared host (sidecars)", []).append(entry.pid)
        elif entry.key.endswith(".operator"):
            pids.setdefault("operators", []).append(entry.pid)
    return pids


def component_cpu(region: Region) -> dict[str, float]:
    """Cumulative CPU seconds of each component's processes now (gone ones count 0)."""
    return {
        name: sum(c for pid in pids if not math.isnan(c := cpu_seconds(pid)))
        for name, pids in component_pids(region).items()
    }


def apiserver_metrics(api: k8s.ApiClient) -> dict[str, float]:
    """The apiserver's own /metrics (the region's admin client: a client certificate)."""
    response = api.call_api("GET", f"{api.configuration.host}/metrics")
    response.read()
    return scrape(response.data.decode())


@dataclass
class Counters:
    """Cumulative counters at one moment."""

    at: float
    operator: dict[str, float]
    apiserver: dict[str, float]
    cpu: float
    components: dict[str, float]

    @classmethod
    def read(cls, region: Region, api: k8s.ApiClient, active: OperatorPod) -> Counters:
        return cls(
            time.monotonic(), operator_metrics(active), apiserver_metrics(api),
            cpu_seconds(active.pid), component_cpu(region),
        )  # fmt: skip

    def cpu_by_component(self, before: Counters) -> dict[str, float]:
        """CPU seconds each component spent between the two readings."""
        return {
            name: round(self.components.get(name, 0.0) - before.components.get(name, 0.0), 2)
            for name in sorted(set(self.components) | set(before.components))
        }

    def minus(self, before: Counters) -> dict[str, float]:
        def op(name: str, where: str = "") -> float:
            return total(self.operator, name, where) - total(before.operator, name, where)

        def server(name: str, where: str = "") -> float:
            return total(self.apiserver, name, where) - total(before.apiserver, name, where)

        def requests(resource: str, verb: str, *, refused: bool = False) -> float:
            """Requests of ``resource`` (its subresources too) with ``verb``."""
            return _requests(self.apiserver, resource, verb, refused=refused) - _requests(
                before.apiserver, resource, verb, refused=refused
            )

        return {
            "operator_status_writes": op("hotload_operator_status_writes_total"),
            "operator_deployment_status_writes": op(
                "hotload_operator_status_writes_total", 'kind="RolloutDeployment"'
            ),
            "operator_api_requests": op("hotload_operator_api_requests_total"),
            "operator_reconciles": op("hotload_operator_reconcile_seconds_count"),
            "operator_cpu_seconds": self.cpu - before.cpu,
            "apiserver_requests_all_clients": server("apiserver_request_total"),
            "apiserver_patches_all_clients": server("apiserver_request_total", 'verb="PATCH"'),
            "apiserver_pod_patches": requests("pods", "PATCH"),
            "apiserver_pod_patches_refused": requests("pods", "PATCH", refused=True),
            "apiserver_pod_gets": requests("pods", "GET"),
        }


# --- one size -------------------------------------------------------------------------


@dataclass
class SizeResult:
    replicas: int
    region: str = ""
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    samples_s: list[float] = field(default_factory=list)
    first_full_all_ready_s: float | None = None
    restart: dict[str, Any] = field(default_factory=dict)
    ledger_bytes: int | None = None
    deployment_status_bytes: int | None = None
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    sidecar_memory: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        per_snapshot = [s["all_ready_s"] for s in self.snapshots if s["all_ready_s"]]
        costs = {
            key: statistics.median(s["cost"][key] for s in self.snapshots)
            for key in (self.snapshots[0]["cost"] if self.snapshots else {})
        }
        target_set = [s["target_set_s"] for s in self.snapshots if s["target_set_s"] is not None]
        components = sorted(
            {name for s in self.snapshots for name in s.get("cpu_seconds_by_component", {})}
        )
        cpu_by_component = {
            name: round(
                statistics.median(
                    s.get("cpu_seconds_by_component", {}).get(name, 0.0) for s in self.snapshots
                ),
                2,
            )
            for name in components
        }
        return {
            "replicas": self.replicas,
            "region": self.region,
            "snapshots": len(self.snapshots),
            "samples": len(self.samples_s),
            "apply_to_target_set_median_s": round(statistics.median(target_set), 3)
            if target_set
            else None,
            "apply_to_first_replica_ready_median_s": round(
                statistics.median(s["first_ready_s"] for s in self.snapshots), 3
            )
            if self.snapshots
            else None,
            "apply_to_ready_p50_s": round(percentile(self.samples_s, 50), 3),
            "apply_to_ready_p99_s": round(percentile(self.samples_s, 99), 3),
            "apply_to_all_ready_median_s": round(statistics.median(per_snapshot), 3)
            if per_snapshot
            else None,
            "median_cost_per_snapshot": {k: round(v, 3) for k, v in costs.items()},
            "median_cpu_seconds_per_snapshot_by_component": cpu_by_component,
            "load_average_1m_median": round(
                statistics.median(s.get("load_average_1m", math.nan) for s in self.snapshots), 2
            )
            if self.snapshots
            else None,
            "first_full_all_ready_s": self.first_full_all_ready_s,
            "ledger_bytes_per_snapshot_object": self.ledger_bytes,
            "deployment_status_bytes": self.deployment_status_bytes,
            "operator_peak_rss_mib": self.peak_rss_mib,
            "sidecar_memory": self.sidecar_memory,
            "rolling_restart": self.restart,
        }


class Bench:
    def __init__(self, region: Region, api: k8s.ApiClient, work: Path, timeout_s: float) -> None:
        self.region = region
        self.api = api
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self.apps = k8s.AppsV1Api(api)
        self.work = work
        self.timeout_s = timeout_s
        self.applied_wall = 0.0

    def active_operator(self) -> OperatorPod:
        def find() -> OperatorPod | None:
            for pod in operator_pods(self.region, self.api):
                if total(operator_metrics(pod), "hotload_operator_reconcilers") > 0:
                    return pod
            return None

        found = wait_until(find, self.timeout_s, interval_s=1.0)
        if found is None:
            raise SystemExit("no active operator found")
        return found

    @contextmanager
    def deployment(self, namespace: str, replicas: int, bucket: Path) -> Iterator[None]:
        self.core.create_namespace({"metadata": {"name": namespace}})
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace,
                                                    "rolloutdeployments", {
            "apiVersion": API_VERSION, "kind": "RolloutDeployment",
            "metadata": {"name": DEPLOYMENT},
            "spec": {
                "model": {"name": "tiny", "servedName": "policy"},
                "engine": {"kind": "noop"}, "replicas": replicas,
                "hotLoad": {"bucketUrl": f"file://{bucket}"},
                "scheduling": {"tolerations": [TOLERATION]},
                "retention": {"keepSnapshots": 5},
            },
        })  # fmt: skip
        try:
            yield
        finally:
            log(f"removing {namespace}")
            self.core.delete_namespace(namespace)
            wait_until(lambda: not self._pods_left(namespace), self.timeout_s, interval_s=2.0)

    def _pods_left(self, namespace: str) -> bool:
        """Whether any pod of ``namespace`` is left (one item asked for, not 1,000).

        An API server busy deleting three regions' 3,000 pods may answer 429 or time out
        (504): that is "not yet", asked again, not the end of a run whose measurements are
        all taken (a 504 here once lost a 3 x 1,000 run's results)."""
        try:
            return bool(self.core.list_namespaced_pod(namespace, limit=1).items)
        except k8s.ApiException as err:
            if err.status == 429 or (err.status or 0) >= 500:
                log(f"pods of {namespace} not listed ({err.status}); asking again")
                return True
            raise

    def apply(self, namespace: str, snapshot: TinySnapshot) -> float:
        began = time.monotonic()
        self.applied_wall = time.time()
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "policysnapshots", snapshot.policy_snapshot(DEPLOYMENT)
        )
        return began

    def target_set_after(self, namespace: str, identity: str) -> float | None:
        """Seconds from the apply to the operator's ``status.propagation.targetSetAt``."""
        body = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "policysnapshots", identity
        )
        stamp = ((body.get("status") or {}).get("propagation") or {}).get("targetSetAt")
        if not stamp:
            return None
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        return round(moment - self.applied_wall, 3)

    def wait_all(self, watcher: PodWatcher, identity: str, replicas: int) -> dict[str, float]:
        def everywhere() -> dict[str, float] | None:
            times = watcher.ready_times(identity)
            return times if len(times) >= replicas else None

        times = wait_until(everywhere, self.timeout_s, interval_s=0.2)
        if not times:
            raise SystemExit(f"{identity} did not reach all {replicas} replicas in time")
        return times

    def finish(self, result: SizeResult, namespace: str, last: str) -> None:
        """What is measured once per size: object sizes, operators' and sidecars' memory."""
        body = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "policysnapshots", last
        )
        result.ledger_bytes = len(json.dumps(body))
        rd = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "rolloutdeployments", DEPLOYMENT
        )
        result.deployment_status_bytes = len(json.dumps(rd.get("status") or {}))
        result.peak_rss_mib = {
            pod.name: round(peak_rss_mib(pod.pid), 1)
            for pod in operator_pods(self.region, self.api)
        }
        result.sidecar_memory = sidecar_memory(self.region, result.replicas)

    def rolling_restart(
        self, watcher: PodWatcher, namespace: str, identity: str, replicas: int, sample: int
    ) -> dict[str, Any]:
        """``kubectl rollout restart`` measured the same way: restart → new pod serves it."""
        old = {p.metadata.uid for p in self.core.list_namespaced_pod(
            namespace, label_selector=label_selector(DEPLOYMENT)).items}  # fmt: skip
        wanted = min(sample, replicas)
        began = time.monotonic()
        stamp = {"kubectl.kubernetes.io/restartedAt": datetime.now(UTC).isoformat()}
        self.apps.patch_namespaced_stateful_set(
            DEPLOYMENT, namespace, {"spec": {"template": {"metadata": {"annotations": stamp}}}}
        )

        def replaced() -> dict[str, tuple[str, float]] | None:
            fresh = {u: v for u, v in watcher.ready_by_uid(identity).items() if u not in old}
            return fresh if len(fresh) >= wanted else None

        fresh = wait_until(replaced, self.timeout_s * 4, interval_s=0.5)
        if not fresh:
            return {"outcome": "timeout", "replaced": 0}
        samples = sorted(t - began for _, t in fresh.values())[:wanted]
        per_pod = samples[-1] / len(samples)
        measured = {
            "replaced_pods_measured": len(samples),
            "p50_s": round(percentile(samples, 50), 2),
            "p99_s": round(percentile(samples, 99), 2),
            "seconds_per_replacement": round(per_pod, 2),
        }
        if wanted < replicas:
            measured["projected_all_ready_s"] = round(per_pod * replicas, 1)
            measured["projected_p50_s"] = round(per_pod * replicas / 2, 1)
        else:
            measured["all_ready_s"] = round(samples[-1], 2)
        return measured


def run_size(
    benches: list[Bench], replicas: int, snapshots: int, restart_pods: int
) -> list[SizeResult]:
    """One size in every region at once: the same snapshots applied to all, ms apart."""
    namespace = f"hl-bench-{replicas}"
    work = benches[0].work
    bucket = work / f"bucket-{replicas}"
    bucket.mkdir(parents=True)
    chain = TinyChain(bucket, work / f"trainer-{replicas}", name=f"p{replicas}")
    results = [SizeResult(replicas, bench.region.name) for bench in benches]
    with ExitStack() as stack:
        for bench in benches:
            stack.enter_context(bench.deployment(namespace, replicas, bucket))
        watchers = [PodWatcher(bench.api, namespace) for bench in benches]
        for watcher in watchers:
            stack.callback(watcher.stop)
        full = asyncio.run(chain.publish(0, full=True))
        began = [bench.apply(namespace, full) for bench in benches]
        for bench, watcher, result, start in zip(benches, watchers, results, began, strict=True):
            first = bench.wait_all(watcher, full.identity, replicas)
            result.first_full_all_ready_s = round(max(first.values()) - start, 2)
            log(f"N={replicas} {bench.region.name}: Full everywhere after "
                f"{result.first_full_all_ready_s} s")  # fmt: skip
        actives = [bench.active_operator() for bench in benches]
        for step in range(1, snapshots + 1):
            snapshot = asyncio.run(chain.publish(step))
            time.sleep(1.0)  # let the previous rollout's trailing writes settle
            before = [
                Counters.read(b.region, b.api, a) for b, a in zip(benches, actives, strict=True)
            ]
            began = [bench.apply(namespace, snapshot) for bench in benches]
            times = [
                bench.wait_all(watcher, snapshot.identity, replicas)
                for bench, watcher in zip(benches, watchers, strict=True)
            ]
            time.sleep(3.0)  # the operator's trailing status writes belong to it
            after = [
                Counters.read(b.region, b.api, a) for b, a in zip(benches, actives, strict=True)
            ]
            for index, result in enumerate(results):
                samples = [t - began[index] for t in times[index].values()]
                result.samples_s += samples
                cost = after[index].minus(before[index])
                result.snapshots.append(
                    {
                        "identity": snapshot.identity,
                        "target_set_s": benches[index].target_set_after(
                            namespace, snapshot.identity
                        ),
                        "first_ready_s": round(min(samples), 3),
                        "p50_s": round(percentile(samples, 50), 3),
                        "p99_s": round(percentile(samples, 99), 3),
                        "all_ready_s": round(max(samples), 3),
                        "cost": cost,
                        "cpu_seconds_by_component": after[index].cpu_by_component(before[index]),
                        "load_average_1m": round(os.getloadavg()[0], 2),
                    }
                )
                log(f"N={replicas} {result.region} {snapshot.identity}: "
                    f"first {min(samples):.2f} s, p50 {percentile(samples, 50):.2f} s, "
                    f"all {max(samples):.2f} s, pod patches/replica "
                    f"{cost['apiserver_pod_patches'] / replicas:.2f} (refused "
                    f"{cost['apiserver_pod_patches_refused'] / replicas:.2f}), pod GETs "
                    f"{cost['apiserver_pod_gets']:.0f}")  # fmt: skip
        last = results[0].snapshots[-1]["identity"]
        for bench, result, watcher in zip(benches, results, watchers, strict=True):
            bench.finish(result, namespace, last)
            if restart_pods > 0:
                result.restart = bench.rolling_restart(
                    watcher, namespace, last, replicas, restart_pods
                )
    return results


def sidecar_memory(region: Region, replicas: int) -> dict[str, float]:
    """The shared hosts' memory for ``replicas`` agents: resident set in all, per agent,
    and per agent above what a host process holds before its first agent (the baseline:
    a Python process that imported what a host imports)."""
    rss = sum(rss_mib(pid) for pid in component_pids(region).get("shared host (sidecars)", []))
    baseline = host_baseline_mib()
    return {
        "hosts_rss_mib": round(rss, 1),
        "per_sidecar_mib": round(rss / replicas, 3) if replicas else math.nan,
        "empty_host_mib": round(baseline, 1),
        "per_sidecar_above_empty_host_mib": round((rss - baseline) / replicas, 3)
        if replicas
        else math.nan,
    }


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


_BASELINE: list[float] = []


def host_baseline_mib() -> float:
    """RSS of a fresh process that imported what a shared host runs (measured once)."""
    if not _BASELINE:
        code = (
            "import hotload.local.runtime.shared_host_main, hotload.local.runtime.agent_factory,"
            " hotload.sidecar, hotload.engines, hotload.kube;"
            "print([l for l in open('/proc/self/status') if l.startswith('VmRSS:')][0])"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        fields = out.stdout.split()
        _BASELINE.append(int(fields[1]) / 1024 if len(fields) >= 2 else 0.0)
    return _BASELINE[0]


def bring_up(state: Path, nodes: int, regions: int = 1) -> LocalRegions:
    names = ["bench"] if regions == 1 else [f"bench-{i + 1}" for i in range(regions)]
    for base in range(231, 254 - regions):
        try:
            return up(names, state_dir=state, index_base=base, nodes=nodes, gpus_per_node=8)
        except RegionIndexTaken:
            continue
    raise SystemExit("no free address index for the benchmark regions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[30, 300, 1000])
    parser.add_argument(
        "--snapshots",
        type=int,
        default=None,
        help="Deltas per size (default: at least 10 and 1,000 samples).",
    )
    parser.add_argument(
        "--restart-pods",
        type=int,
        default=30,
        help="Rolling-restart replacements measured per size.",
    )
    parser.add_argument(
        "--regions", type=int, default=1, help="Regions run side by side (same snapshots)."
    )
    parser.add_argument(
        "--host-schedule",
        choices=["ranked", "fifo"],
        default="ranked",
        help="How each shared host orders its agents' blocking calls (docs/pod-runtime.md).",
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--log-level", default="WARNING", help="Of the region's pods.")
    parser.add_argument(
        "--agent",
        choices=["sidecar", "echo", "sampled"],
        default="sidecar",
        help="sidecar: the real agent (default); echo: a stand-in that reports "
        "each target at once (the control plane's share alone); sampled: the real agent "
        "with a stack sampler in its shared host (sampled_agent.py).",
    )
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "propagation")
    parser.add_argument(
        "--render", type=Path, default=None, help="Only write RESULTS.md beside this results.json."
    )
    args = parser.parse_args()  # fmt: skip
    if args.render is not None:
        (args.render.parent / "RESULTS.md").write_text(
            markdown(json.loads(args.render.read_text()), args.render.parent)
        )
        return

    # The pods inherit the runtime's log level: a thousand agents logging every fetch at INFO
    # into one shared host would measure the logger. The operator logs warnings too.
    os.environ.setdefault("HOTLOAD_LOG_LEVEL", args.log_level)
    os.environ["HOTLOAD_SHARED_HOST_SCHEDULE"] = args.host_schedule
    if args.agent != "sidecar":
        # The stand-in agents live in bench/, which an installed hotload does not carry: the
        # shared hosts (started by the region's pod runtime, which passes its environment
        # on) import them from this checkout.
        paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if args.agent == "echo":
        # Control plane only: each replica reports a target as loaded the moment it sees it.
        os.environ["HOTLOAD_RUNTIME_AGENT_FACTORY"] = "bench.propagation.echo_agent:run"
    elif args.agent == "sampled":
        os.environ["HOTLOAD_RUNTIME_AGENT_FACTORY"] = "bench.propagation.sampled_agent:run"
    nodes = max(1, -(-max(args.replicas) // PODS_PER_NODE)) + 1
    work = Path(tempfile.mkdtemp(prefix="hotload-bench-propagation-"))
    state = work / "state"
    log(f"{args.regions} region(s), {nodes} fake nodes each, state {state}")
    reaper = start_reaper(state)  # should this process be killed, it takes the regions down
    regions = bring_up(state, nodes, args.regions)
    results: list[SizeResult] = []
    try:
        hotload_chart.install(regions.regions, CHART)
        hotload_chart.wait_operator(regions.regions, CHART, timeout_s=args.timeout)
        with ExitStack() as stack:
            benches = [
                Bench(region, stack.enter_context(api_client(region)), work, args.timeout)
                for region in regions.regions
            ]
            for replicas in sorted(args.replicas):
                count = args.snapshots or max(MIN_SNAPSHOTS, -(-MIN_SAMPLES // replicas))
                log(f"N={replicas}: {count} deltas after a Full")
                results += run_size(benches, replicas, count, args.restart_pods)
                write_results(args, results)  # each size as soon as it is measured
    finally:
        down(state)
        reaper.terminate()


def write_results(args: argparse.Namespace, results: list[SizeResult]) -> None:
    summaries = [r.summary() for r in results]
    base = summaries[0] if summaries else None
    growth = []
    for summary in summaries:
        if base is None:
            break
        ratio = summary["replicas"] / base["replicas"]
        cost, base_cost = summary["median_cost_per_snapshot"], base["median_cost_per_snapshot"]
        growth.append({
            "replicas": summary["replicas"],
            "replicas_ratio": ratio,
            "operator_status_writes_ratio": _ratio(cost, base_cost, "operator_status_writes"),
            "operator_api_requests_ratio": _ratio(cost, base_cost, "operator_api_requests"),
            "operator_cpu_seconds_ratio": _ratio(cost, base_cost, "operator_cpu_seconds"),
            "p50_ratio": round(summary["apply_to_ready_p50_s"] / base["apply_to_ready_p50_s"], 2),
        })  # fmt: skip
    document = {
        "benchmark": "propagation: PolicySnapshot applied → each replica serves it (noop engine, "
        "shared mode, chart-installed operator)",
        "agent": args.agent,
        "host_schedule": args.host_schedule,
        "regions": args.regions,
        "command": " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release(), "note": "shared by other work; quote medians"},
        "target": "issue 27: at 1,000 replicas in one region p50 <= 10 s, p99 <= 20 s; "
        "<= 1.2 pod writes per replica per delta, no per-replica periodic reads; the region's "
        "CPU <= 25 ms per replica per snapshot; apply -> first replica Ready <= 1 s; "
        "<= 2 MB per shared-mode sidecar",
        "baseline": "rolling restart of the same StatefulSet, measured the same way",
        "load_average_at_write": [round(x, 2) for x in os.getloadavg()],
        "sizes": summaries,
        "growth_vs_smallest": growth,
        "per_snapshot": {str(r.replicas): r.snapshots for r in results},
    }  # fmt: skip
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / "results.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    (args.results / "RESULTS.md").write_text(markdown(document, args.results))
    log(f"results in {path} and RESULTS.md beside it")


def markdown(document: dict[str, Any], where: Path) -> str:
    """The summary table of a results document (RESULTS.md), then ``where``'s
    ``analysis.md`` (how to read that run), when there is one."""
    lines = [
        "# bench/propagation — results",
        "",
        f"Command: `{document['command']}`  ",
        f"When: {document['when']}; machine: {document['machine']['cpus']} CPUs, shared with "
        "other work (medians and ratios, not single runs); load average when written: "
        f"{document.get('load_average_at_write', '-')}.",
        "",
        f"Target: {document['target']}. Baseline: {document['baseline']}.",
        "",
        "| replicas | region | samples | apply→target set (median) | apply→first replica "
        "(median) | apply→Ready p50 | p99 | apply→all (median) | rolling restart p50 "
        "| operator status writes / snapshot | operator API requests / snapshot | operator CPU "
        "s / snapshot | all clients' API requests / snapshot | pod writes / replica / snapshot "
        "| pod writes refused (429) / replica / snapshot | pod GETs / snapshot "
        "| region CPU ms / replica / snapshot | sidecar MiB (above an "
        "empty host) | operator peak RSS MiB | PolicySnapshot bytes | load average (1 min, "
        "median over snapshots) |",
        "|" + "---|" * 22,
    ]
    for size in document["sizes"]:
        cost = size["median_cost_per_snapshot"]
        restart = size["rolling_restart"]
        restart_p50 = restart.get("projected_p50_s", restart.get("p50_s"))
        projected = " (projected)" if "projected_p50_s" in restart else ""
        restart_p50 = "not run" if restart_p50 is None else f"{restart_p50} s"
        rss = max(size["operator_peak_rss_mib"].values(), default=None)
        replicas = size["replicas"]
        pod_writes = cost.get("apiserver_pod_patches")
        per_replica = f"{pod_writes / replicas:.2f}" if pod_writes is not None else "-"
        refused = cost.get("apiserver_pod_patches_refused")
        refused_per_replica = f"{refused / replicas:.2f}" if refused is not None else "-"
        cpu = size.get("median_cpu_seconds_per_snapshot_by_component") or {}
        region_cpu = sum(v for k, v in cpu.items() if k != "bench client")
        memory = size.get("sidecar_memory") or {}
        lines.append(
            f"| {replicas} | {size.get('region', '')} | {size['samples']} "
            f"| {size['apply_to_target_set_median_s']} s "
            f"| {size['apply_to_first_replica_ready_median_s']} s "
            f"| {size['apply_to_ready_p50_s']} s | {size['apply_to_ready_p99_s']} s "
            f"| {size['apply_to_all_ready_median_s']} s | {restart_p50}{projected} "
            f"| {cost.get('operator_status_writes')} | {cost.get('operator_api_requests')} "
            f"| {cost.get('operator_cpu_seconds')} | {cost.get('apiserver_requests_all_clients')} "
            f"| {per_replica} | {refused_per_replica} | {cost.get('apiserver_pod_gets', '-')} "
            f"| {region_cpu / replicas * 1000:.1f} "
            f"| {memory.get('per_sidecar_above_empty_host_mib', '-')} "
            f"| {rss} | {size['ledger_bytes_per_snapshot_object']} "
            f"| {size.get('load_average_1m_median', '-')} |"
        )
    lines += ["", "Growth against the smallest size (cost per snapshot; 1.0 = flat):", ""]
    lines += ["| replicas | x replicas | status writes | operator API requests | operator CPU "
              "| p50 |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in document["growth_vs_smallest"]:
        lines.append(
            f"| {row['replicas']} | {row['replicas_ratio']:.0f} "
            f"| {row['operator_status_writes_ratio']} | {row['operator_api_requests_ratio']} "
            f"| {row['operator_cpu_seconds_ratio']} | {row['p50_ratio']} |"
        )
    lines += _cpu_table(document["sizes"])
    analysis = where / "analysis.md"
    if analysis.exists():
        lines += ["", analysis.read_text().rstrip()]
    return "\n".join(lines) + "\n"


def _cpu_table(sizes: list[dict[str, Any]]) -> list[str]:
    """Where the machine's CPU goes per snapshot: each component's median CPU seconds, and
    the region's total per replica (every process of the region but the bench's own
    watching client; the whole region shares this machine's cores)."""
    key = "median_cpu_seconds_per_snapshot_by_component"
    rows = [(s["replicas"], s.get("region", ""), s[key]) for s in sizes if s.get(key)]
    if not rows:
        return []
    names = sorted({name for _, _, cpu in rows for name in cpu})
    lines = [
        "",
        "CPU seconds per snapshot by process (median; every process of the region runs on "
        "this machine):",
        "",
        "| replicas | region | " + " | ".join(names) + " | region total (without the bench "
        "client) | region per replica |",
        "|---|---|" + "---|" * (len(names) + 2),
    ]
    for replicas, region, cpu in rows:
        total = sum(v for k, v in cpu.items() if k != "bench client")
        cells = " | ".join(f"{cpu.get(name, 0.0):.2f}" for name in names)
        lines.append(
            f"| {replicas} | {region} | {cells} | {total:.2f} | {total / replicas * 1000:.1f} ms |"
        )
    return lines


def _ratio(cost: dict[str, float], base: dict[str, float], key: str) -> float | None:
    if not base.get(key):
        return None
    return round(cost.get(key, 0.0) / base[key], 2)


if __name__ == "__main__":
    main()
