"""Time from a target change to Ready, phase by phase, delta vs full (~0.5B bf16 model).

Everything is real: one local region (etcd, kube-apiserver, kwok, the pod runtime), a pod
of ``examples/pod.yaml`` whose containers are the real ``hotload engine reference``
(serving the Qwen2.5-0.5B shape built from its config) and the real ``hotload sidecar``,
a ``file://`` bucket on local disk, and the test trainer publishing a Full snapshot, then
deltas in which an RL-like 3% of the bf16 weights moved by one ULP. For each snapshot it
moves ``status.targetSnapshot`` and measures the wall time until the pod's annotations
say Ready, with the sidecar's own split (fetch, verify, rebuild, swap) and bytes.

The rolling-restart baseline is measured too: a fresh ``hotload engine reference``
process started on the full snapshot (process start + loading it), plus fetching that
snapshot from the bucket (the sidecar's measured fetch of the Full). Results go to
``results.md`` and ``results.json`` beside this file.

    ~/.cache/hotload/venv/bin/python -m bench.swap.run_swap_bench [--size 0.5b] [--deltas 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s

from hotload.api.pod import REFERENCE_ENGINE_PORT
from hotload.errors import RegionIndexTaken
from hotload.local import down, up
from hotload.local.bootstrap import api_client
from hotload.local.trainer import PolicyTrainer
from hotload.local.trainer import PublishedSnapshot as Published
from hotload.storage import open_storage
from tests.integration.sidecar.harness import SidecarHarness, eventually, rollout_deployment

HERE = Path(__file__).resolve().parent
HOTLOAD = str(Path(sys.executable).with_name("hotload"))
DEPLOYMENT = "bench"
#: What engine-facts.md quotes for SGLang/vLLM restarts (read from their sources/issues).
PUBLISHED_RESTARTS = (
    "SGLang/vLLM: a full reload/restart takes 30-100+ s for mid-size models and minutes "
    "for the largest (e.g. ~5-6.5 min for a 235B FP8 restart) - engine-facts.md"
)


async def _measure(harness: SidecarHarness, replica: Any, snapshot: Published) -> dict[str, Any]:
    """Move the target to ``snapshot``; seconds until Ready, and the sidecar's split."""
    started = time.perf_counter()
    harness.set_target(DEPLOYMENT, snapshot.ref())

    def ready() -> bool:
        annotations = harness.annotations(replica.pod)
        return (
            annotations.get("hotload.dev/snapshot") == snapshot.identity
            and annotations.get("hotload.dev/state") == "Ready"
        )

    await eventually(ready, timeout=1800, what=f"Ready at {snapshot.identity}", interval=0.05)
    elapsed = time.perf_counter() - started
    status = await harness.status(replica)
    swap = status["history"][0]
    if swap["identity"] != snapshot.identity:
        raise AssertionError(f"the newest swap is {swap['identity']}, not {snapshot.identity}")
    return {
        "identity": snapshot.identity,
        "kind": snapshot.kind.value,
        "via": swap["via"],
        "target_to_ready_s": round(elapsed, 3),
        "sidecar_seconds": swap["seconds"],
        "fetched_bytes": swap["fetchedBytes"],
        "stored_bytes": snapshot.stored_bytes,
    }


async def _restart_baseline(size: str, weights: Path, host: str) -> float:
    """Seconds from starting a fresh engine on ``weights`` until it answers /health."""
    port = REFERENCE_ENGINE_PORT
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    started = time.perf_counter()
    process = subprocess.Popen(
        [
            HOTLOAD,
            "engine",
            "reference",
            "--host",
            host,
            "--port",
            str(port),
            "--model-config",
            size,
            "--weights",
            str(weights),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError("the baseline engine exited")
            try:
                async with httpx.AsyncClient(trust_env=False) as client:
                    answer = await client.get(f"http://{host}:{port}/health", timeout=2)
                return answer.status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(healthy, timeout=1800, what="the baseline engine", interval=0.05)
        return time.perf_counter() - started
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


async def _run(size: str, deltas: int, fraction: float, workdir: Path) -> dict[str, Any]:
    state = workdir / "state"
    regions = None
    for base in range(151, 191, 2):
        try:
            regions = up(["bench"], state_dir=state, index_base=base, nodes=1)
            break
        except RegionIndexTaken:
            continue
    if regions is None:
        raise RuntimeError("no free region index for the benchmark")
    region = regions.regions[0]
    api = api_client(region)
    namespace = f"bench-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    bucket = workdir / "bucket"
    bucket.mkdir()
    storage = open_storage(f"file://{bucket}")
    harness = SidecarHarness(api, region, namespace, workdir / "pods")
    harness.workdir.mkdir()
    try:
        print(f"building the {size} trainer model ...", flush=True)
        trainer = PolicyTrainer(workdir / "trainer", storage, name="policy", size=size)
        harness.create_deployment(rollout_deployment(DEPLOYMENT, f"file://{bucket}"))
        print("starting the pod (engine + sidecar) ...", flush=True)
        replica = await harness.replica(
            f"{DEPLOYMENT}-0",
            DEPLOYMENT,
            engine_args=("--model-config", size),
            serving_timeout=1800,
        )
        results = []
        full = await trainer.publish_full()
        print(f"full published: {full.stored_bytes} bytes", flush=True)
        results.append(await _measure(harness, replica, full))
        print(json.dumps(results[-1]), flush=True)
        for _ in range(deltas):
            trainer.perturb(fraction)
            delta = await trainer.publish_delta()
            results.append(await _measure(harness, replica, delta))
            print(json.dumps(results[-1]), flush=True)
        print("measuring the rolling-restart baseline ...", flush=True)
        cold = await _restart_baseline(size, bucket / full.identity, "127.0.0.1")
        fetch_full = float(results[0]["sidecar_seconds"]["fetch"])
        return {
            "size": size,
            "changed_fraction": fraction,
            "swaps": results,
            "restart_baseline": {
                "engine_cold_start_with_weights_s": round(cold, 3),
                "fetch_full_s": round(fetch_full, 3),
                "total_s": round(cold + fetch_full, 3),
            },
            "published_restart_costs": PUBLISHED_RESTARTS,
        }
    finally:
        harness.stop_all()
        await storage.aclose()
        api.close()
        down(state)


def _markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "# Swap benchmark: target change to Ready, delta vs full",
        "",
        f"Command: `{command}`  ",
        f"Date: {report['date']}  ",
        f"Machine: {report['machine']}  ",
        f"Model: reference engine, `{report['size']}` shape, bf16 snapshots; deltas move "
        f"{report['changed_fraction']:.0%} of the weights by one ULP.",
        "",
        "| snapshot | via | target→Ready s | fetch s | verify s | rebuild s | swap s |"
        " bytes stored | bytes fetched |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for swap in report["swaps"]:
        seconds = swap["sidecar_seconds"]
        lines.append(
            f"| {swap['identity']} | {swap['via']} | {swap['target_to_ready_s']:.2f} |"
            f" {seconds.get('fetch', 0):.2f} | {seconds.get('verify', 0):.2f} |"
            f" {seconds.get('rebuild', 0):.2f} | {seconds.get('swap', 0):.2f} |"
            f" {swap['stored_bytes']:,} | {swap['fetched_bytes']:,} |"
        )
    full = report["swaps"][0]
    deltas = report["swaps"][1:]
    baseline = report["restart_baseline"]
    lines += [
        "",
        "Rolling-restart baseline (measured): a fresh engine process started on the full "
        f"snapshot answered after {baseline['engine_cold_start_with_weights_s']:.2f} s, plus "
        f"{baseline['fetch_full_s']:.2f} s to fetch the full snapshot = "
        f"**{baseline['total_s']:.2f} s** per replica, with no serving meanwhile.",
        "",
        f"Published restart costs: {report['published_restart_costs']}.",
    ]
    if deltas:
        mean = sum(d["target_to_ready_s"] for d in deltas) / len(deltas)
        ratio = full["stored_bytes"] / (sum(d["stored_bytes"] for d in deltas) / len(deltas))
        lines += [
            "",
            f"Deltas: mean target→Ready {mean:.2f} s vs {full['target_to_ready_s']:.2f} s for"
            f" the full load; {ratio:.1f}x fewer bytes moved per update. Serving continues"
            " during fetch, verify and rebuild; only the swap column touches traffic.",
        ]
    lines += [
        "",
        "The machine is shared (2 cores, other work running): read the numbers as an order"
        " of magnitude, and the split as where the time goes.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.5b", help="reference model size (tiny, small, 0.5b)")
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--changed-fraction", type=float, default=0.03)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="hotload-swap-bench-"))
    try:
        report = asyncio.run(_run(args.size, args.deltas, args.changed_fraction, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"
    command = "python -m bench.swap.run_swap_bench " + " ".join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "results.md").write_text(_markdown(report, command.strip()))
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
