"""Time from a target change to Ready, delta vs full, beside the physical limit.

Everything is real: one local region (etcd, kube-apiserver, kwok, the pod runtime with its
Memory emptyDir on tmpfs), a MinIO bucket that the sidecar reads through a toxiproxy link
at a stated rate (``--rate-mb-s``, ``--latency-ms``), a pod of ``examples/pod.yaml`` whose
containers are the real ``hotload engine reference`` (the Qwen2.5-0.5B shape built from
its config) and the real ``hotload sidecar``, and the trainer (``PolicyTrainer``) taking
real AdamW steps on a next-token loss before each delta (not a fixed share of one-ULP
changes). For each snapshot it moves ``status.targetSnapshot`` and measures the wall time
until the pod's annotations say Ready, with the sidecar's split (fetch, verify, rebuild,
swap), the bytes and whether the delta was patched in the engine (``inEngine``: then
there is no rebuild before Ready, staging catches up after), while a client streams
tokens from the engine: the longest gap between two tokens during the swap, less the
median gap, is the engine's pause. Before each next step it waits for staging to catch
up, as a trainer's step time would leave it.

The limit of the same path, measured in the same run: the delta's bytes over the link
(bytes / stated rate + latency), one memory pass over the model's bytes (a copy of the
rebuilt shard on tmpfs into memory already faulted in), and the engine's own floor (its
load of the already rebuilt directory from tmpfs, asked directly), each measured while
the same client streams tokens (the swaps' conditions) and idle. The rolling-restart
baseline is measured too: a fresh engine process started on the full snapshot, plus
fetching that snapshot over the link. Results go to ``results.md`` and ``results.json``.

    ~/.cache/hotload/venv/bin/python -m bench.swap.run_swap_bench \
        [--size 0.5b | bench/swap/model-144m.json] [--deltas 3] [--lr 1e-6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from kubernetes import client as k8s

from hotload.api.pod import REFERENCE_ENGINE_PORT, STAGING_MOUNT_PATH
from hotload.errors import RegionIndexTaken
from hotload.local import down, object_storage, up, wan
from hotload.local.bootstrap import api_client
from hotload.local.region import RegionAddons, WanLink
from hotload.local.trainer import PolicyTrainer
from hotload.local.trainer import PublishedSnapshot as Published
from hotload.snapshot import REBUILT_NAME
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
STREAM_TOKENS = 4000


class TokenClock:
    """Streams a completion from the engine and notes when each token arrives."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url
        self.stamps: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TokenClock:
        self._task = asyncio.create_task(self._stream())
        await eventually(lambda: len(self.stamps) >= 3, timeout=600, what="tokens flowing")
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task

    async def _stream(self) -> None:
        body = {"prompt": "A trainer publishes", "max_tokens": STREAM_TOKENS, "stream": True}
        async with (
            httpx.AsyncClient(trust_env=False, timeout=None) as client,
            client.stream("POST", f"{self.engine_url}/v1/completions", json=body) as response,
        ):
            async for line in response.aiter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    self.stamps.append(time.perf_counter())

    def pause(self, start: float, end: float) -> dict[str, float | None]:
        """The longest gap between two tokens within [start, end], and the median gap."""
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        during = [
            b - a
            for a, b in zip(self.stamps, self.stamps[1:], strict=False)
            if b >= start and a <= end
        ]
        median = statistics.median(gaps) if gaps else None
        longest = max(during) if during else None
        return {
            "median_gap_s": median,
            "longest_gap_s": longest,
            "pause_s": None if longest is None or median is None else max(0.0, longest - median),
            "tokens": float(len(self.stamps)),
        }


async def _measure(
    harness: SidecarHarness, replica: Any, snapshot: Published, stream: bool
) -> dict[str, Any]:
    """Move the target to ``snapshot``; seconds until Ready, the sidecar's split, the pause."""

    def ready() -> bool:
        annotations = harness.annotations(replica.pod)
        return (
            annotations.get("hotload.dev/snapshot") == snapshot.identity
            and annotations.get("hotload.dev/state") == "Ready"
        )

    clock = TokenClock(replica.engine_url) if stream else None
    async with clock if clock is not None else contextlib.nullcontext():
        started = time.perf_counter()
        harness.set_target(DEPLOYMENT, snapshot.ref())
        await eventually(ready, timeout=1800, what=f"Ready at {snapshot.identity}", interval=0.02)
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0.5)  # a few tokens after the swap, so its gap is closed
    status = await harness.status(replica)
    swap = status["history"][0]
    if swap["identity"] != snapshot.identity:
        raise AssertionError(f"the newest swap is {swap['identity']}, not {snapshot.identity}")
    return {
        "identity": snapshot.identity,
        "kind": snapshot.kind.value,
        "via": swap["via"],
        "in_engine": bool(swap.get("inEngine")),
        "target_to_ready_s": round(elapsed, 3),
        "sidecar_seconds": swap["seconds"],
        "fetched_bytes": swap["fetchedBytes"],
        "stored_bytes": snapshot.stored_bytes,
        "full_bytes": snapshot.full_bytes,
        "changed_ratio": round(snapshot.ratio, 1),
        "loss": snapshot.loss,
        "pause": clock.pause(started, started + elapsed) if clock is not None else None,
    }


async def _staging_caught_up(harness: SidecarHarness, replica: Any, identity: str) -> float:
    """Seconds until the served buffer holds ``identity`` (a delta patched in the engine
    is staged after Ready); 0 when it already does."""
    started = time.perf_counter()

    async def caught_up() -> bool:
        buffers = (await harness.status(replica))["buffers"]
        served = buffers.get("served")
        return served is not None and buffers.get(served) == identity

    await eventually(caught_up, timeout=600, what=f"staging holding {identity}", interval=0.05)
    return time.perf_counter() - started


def _memory_pass(shard: Path, repeats: int = 3) -> float:
    """Median seconds to copy the model's bytes once (tmpfs file → memory already faulted)."""
    size = shard.stat().st_size
    source = np.memmap(shard, dtype=np.uint8, mode="r", shape=(size,))
    target = np.empty(size, dtype=np.uint8)
    target.fill(0)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - started)
    del source
    return statistics.median(times)


def _rebuilt_directory(staging: Path, identity: str) -> Path:
    for record in staging.resolve().rglob(REBUILT_NAME):
        if json.loads(record.read_text()).get("identity") == identity:
            return record.parent
    raise AssertionError(f"no rebuilt directory of {identity} in staging")


async def _engine_floor(replica: Any, staging: Path, identity: str, repeats: int = 3) -> float:
    """Median seconds the engine takes to load the already rebuilt directory from tmpfs."""
    directory = _rebuilt_directory(staging, identity)
    mount_path = f"{STAGING_MOUNT_PATH}/{directory.relative_to(staging.resolve()).as_posix()}"
    times = []
    async with httpx.AsyncClient(trust_env=False, timeout=600) as client:
        for _ in range(repeats):
            started = time.perf_counter()
            response = await client.post(
                f"{replica.engine_url}/admin/load",
                json={"path": mount_path, "identity": identity, "kind": "Full"},
            )
            response.raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


async def _restart_baseline(size: str, weights: Path, host: str) -> float:
    """Seconds from starting a fresh engine on ``weights`` until it answers /health."""
    port = REFERENCE_ENGINE_PORT
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    if "PYTHONPATH" in os.environ:  # a work tree's code, as the pods run it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
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


async def _run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    state = workdir / "state"
    link = WanLink(rate_kb_s=int(args.rate_mb_s * 1000), latency_ms=args.latency_ms)
    addons = RegionAddons(object_storage=True, wan=link, replication=False)
    regions = None
    for base in range(151, 191, 2):
        try:
            regions = up(["bench"], state_dir=state, index_base=base, nodes=1, addons=addons)
            break
        except RegionIndexTaken:
            continue
    if regions is None:
        raise RuntimeError("no free region index for the benchmark")
    region = regions.regions[0]
    api = api_client(region)
    namespace = f"bench-{secrets.token_hex(3)}"
    k8s.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    creds = object_storage.credentials(region)
    bucket = object_storage.bucket_url(region)
    storage = open_storage(bucket, endpoint=object_storage.endpoint(region), credentials=creds)
    harness = SidecarHarness(api, region, namespace, workdir / "pods")
    harness.workdir.mkdir()
    try:
        print(f"building the {args.size} trainer model ...", flush=True)
        trainer = PolicyTrainer(
            workdir / "trainer", storage, name="policy", size=args.size, lr=args.lr
        )
        harness.create_deployment(
            rollout_deployment(
                DEPLOYMENT, bucket, endpoint=wan.endpoint(region), secret=f"{DEPLOYMENT}-0-bucket"
            )
        )
        print("starting the pod (engine + sidecar) ...", flush=True)
        replica = await harness.replica(
            f"{DEPLOYMENT}-0",
            DEPLOYMENT,
            engine_args=("--model-config", args.size),
            sidecar_args=("--download-concurrency", str(args.streams)),
            serving_timeout=1800,
            credentials={
                "AWS_ACCESS_KEY_ID": creds.access_key_id,
                "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
            },
        )
        results = []
        full = await trainer.publish_full()
        print(f"full published: {full.stored_bytes} bytes", flush=True)
        results.append(await _measure(harness, replica, full, stream=True))
        print(json.dumps(results[-1]), flush=True)
        for _ in range(args.deltas):
            loss = await asyncio.to_thread(trainer.train_step)
            print(f"AdamW step {trainer.step}: loss {loss:.4f}", flush=True)
            delta = await trainer.publish_delta()
            results.append(await _measure(harness, replica, delta, stream=True))
            results[-1]["staging_after_ready_s"] = round(
                await _staging_caught_up(harness, replica, delta.identity), 3
            )
            print(json.dumps(results[-1]), flush=True)
        last = results[-1]["identity"]
        print("measuring the limits ...", flush=True)
        shard = _rebuilt_directory(replica.staging, last) / "model.safetensors"
        # The deltas ran while a client streamed tokens: the limit is measured in the same
        # conditions (streaming), and idle beside it.
        memory_idle = _memory_pass(shard)
        floor_idle = await _engine_floor(replica, replica.staging, last)
        async with TokenClock(replica.engine_url) as clock:
            memory_pass = await asyncio.to_thread(_memory_pass, shard)
            floor = await _engine_floor(replica, replica.staging, last)
            streamed = len(clock.stamps)
        if streamed < 10:
            raise AssertionError(f"only {streamed} tokens streamed while the floor was measured")
        print("measuring the rolling-restart baseline ...", flush=True)
        cold = await _restart_baseline(
            args.size, workdir / "trainer" / "weights" / full.identity, "127.0.0.1"
        )
        fetch_full = float(results[0]["sidecar_seconds"]["fetch"])
        rate = args.rate_mb_s * 1e6
        for swap in results:
            link_s = swap["stored_bytes"] / rate + 2 * args.latency_ms / 1000
            limit = link_s + memory_pass + floor
            idle = link_s + memory_idle + floor_idle
            swap["limit"] = {
                "link_s": round(link_s, 4),
                "memory_pass_s": round(memory_pass, 4),
                "engine_floor_s": round(floor, 4),
                "total_s": round(limit, 4),
                "ratio": round(swap["target_to_ready_s"] / limit, 3),
                "idle_memory_pass_s": round(memory_idle, 4),
                "idle_engine_floor_s": round(floor_idle, 4),
                "idle_total_s": round(idle, 4),
                "idle_ratio": round(swap["target_to_ready_s"] / idle, 3),
            }
        return {
            "size": args.size,
            "lr": args.lr,
            "link": {
                "rate_mb_s": args.rate_mb_s,
                "latency_ms": args.latency_ms,
                "streams": args.streams,
            },
            "model_bytes": shard.stat().st_size,
            "swaps": results,
            "limits": {
                "conditions": "a client streaming tokens, as during the swaps",
                "memory_pass_s": memory_pass,
                "engine_floor_s": floor,
                "idle_memory_pass_s": memory_idle,
                "idle_engine_floor_s": floor_idle,
            },
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


def _idle(numbers: dict[str, Any], key: str) -> str:
    """An idle-condition figure, or "-" for results made before it was measured."""
    value = numbers.get(key)
    return "-" if value is None else f"{value:.2f}"


def _markdown(report: dict[str, Any], command: str) -> str:
    link = report["link"]
    lines = [
        "# Swap benchmark: target change to Ready, delta vs full, beside the physical limit",
        "",
        f"Command: `{command}`  ",
        f"Date: {report['date']}  ",
        f"Machine: {report['machine']}; load average before/after "
        f"{report['load'][0]:.1f} / {report['load'][1]:.1f} (a shared 2-core machine)  ",
        f"Model: reference engine, `{report['size']}` shape, {report['model_bytes']:,} bytes of "
        f"bf16 weights; deltas from real AdamW steps (lr {report['lr']}) of the trainer.  ",
        f"Link: the sidecar reads MinIO through toxiproxy at {link['rate_mb_s']} MB/s per "
        f"connection, {link['latency_ms']} ms each way, with {link.get('streams', 8)} "
        "ranged read(s) per file (`--download-concurrency`); staging is tmpfs (Memory "
        "emptyDir).",
        "",
        "| snapshot | via | target→Ready s | fetch s | verify s | rebuild s | swap s |"
        " bytes fetched | ratio | limit s, streaming (link + memory + engine) | ÷ limit |"
        " idle limit s | ÷ idle limit | engine pause s | staged after Ready s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for swap in report["swaps"]:
        seconds = swap["sidecar_seconds"]
        limit = swap["limit"]
        pause = swap.get("pause") or {}
        pause_s = pause.get("pause_s")
        via = f"{swap['via']}, in engine" if swap.get("in_engine") else swap["via"]
        staged_after = swap.get("staging_after_ready_s")
        lines.append(
            f"| {swap['identity']} | {via} | {swap['target_to_ready_s']:.2f} |"
            f" {seconds.get('fetch', 0):.2f} | {seconds.get('verify', 0):.2f} |"
            f" {seconds.get('rebuild', 0):.2f} | {seconds.get('swap', 0):.2f} |"
            f" {swap['fetched_bytes']:,} | {swap['changed_ratio']}x |"
            f" {limit['total_s']:.2f} ({limit['link_s']:.2f} + {limit['memory_pass_s']:.2f} +"
            f" {limit['engine_floor_s']:.2f}) | {limit['ratio']:.2f} |"
            f" {_idle(limit, 'idle_total_s')} | {_idle(limit, 'idle_ratio')} |"
            f" {'n/a' if pause_s is None else f'{pause_s:.3f}'} |"
            f" {'-' if staged_after is None else f'{staged_after:.2f}'} |"
        )
    full = report["swaps"][0]
    deltas = report["swaps"][1:]
    baseline = report["restart_baseline"]
    lines += [
        "",
        "Limit = the delta's stored bytes over the link at the stated rate (plus one round "
        "trip) + one memory pass over the model's bytes (a copy of the rebuilt shard into "
        "memory, median of 3) + the engine's own floor (its load of the already rebuilt "
        "directory from tmpfs, asked directly, median of 3), all measured in this run and "
        "in the swaps' conditions: while the same client streams tokens from the engine on "
        "the same cores. The idle limit is the same with no client streaming (the engine "
        "floor idle: "
        f"{_idle(report['limits'], 'idle_engine_floor_s')} s, streaming: "
        f"{report['limits']['engine_floor_s']:.2f} s). "
        "Engine pause = the longest gap between two streamed tokens during the swap, less "
        'the median gap. "in engine": the delta was patched into the engine\'s live '
        'weights (no rebuild before Ready); "staged after Ready": how long after Ready '
        "the served buffer held the snapshot (staging catching up, off the critical path).",
        "",
        "Rolling-restart baseline (measured): a fresh engine process started on the full "
        f"snapshot answered after {baseline['engine_cold_start_with_weights_s']:.2f} s, plus "
        f"{baseline['fetch_full_s']:.2f} s to fetch the full snapshot = "
        f"**{baseline['total_s']:.2f} s** per replica, with no serving meanwhile.",
        "",
        f"Published restart costs: {report['published_restart_costs']}.",
    ]
    if deltas:
        times = [d["target_to_ready_s"] for d in deltas]
        ratios = [d["limit"]["ratio"] for d in deltas]
        idle_ratios = [d["limit"].get("idle_ratio") for d in deltas]
        pauses = [(d.get("pause") or {}).get("pause_s") for d in deltas]
        known = [p for p in pauses if p is not None]
        speedup = full["target_to_ready_s"] / statistics.median(times)

        def met(ok: bool) -> str:
            return "met" if ok else "NOT met"

        lines += [
            "",
            "## Targets (deltas, medians)",
            "",
            f"- delta target→Ready ≤ 1.5x the limit (measured streaming, as the deltas): "
            f"{statistics.median(ratios):.2f}x (worst {max(ratios):.2f}x) — "
            f"{met(statistics.median(ratios) <= 1.5)}"
            + (
                f"; against the idle limit {statistics.median(idle_ratios):.2f}x "
                f"(worst {max(idle_ratios):.2f}x)"
                if None not in idle_ratios
                else ""
            ),
            f"- a delta ≥ 5x faster than a Full: {statistics.median(times):.2f} s vs "
            f"{full['target_to_ready_s']:.2f} s = {speedup:.1f}x — {met(speedup >= 5)}",
            "- engine pause ≤ 200 ms: "
            + (
                f"{statistics.median(known) * 1000:.0f} ms (worst {max(known) * 1000:.0f} ms) — "
                f"{met(max(known) <= 0.2)}"
                if known
                else "not measured"
            ),
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
    parser.add_argument(
        "--size",
        default="0.5b",
        help="a reference model size (tiny, small, 0.5b) or a config.json file",
    )
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-5, help="the trainer's AdamW rate")
    parser.add_argument("--rate-mb-s", type=float, default=100.0, help="link rate, MB/s")
    parser.add_argument("--latency-ms", type=int, default=2, help="link latency, each way")
    parser.add_argument(
        "--streams",
        type=int,
        default=1,
        help="the sidecar's parallel ranged reads per file: toxiproxy limits each connection "
        "to the link's rate, so with one stream that rate is the aggregate the limit assumes",
    )
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    if Path(args.size).is_file():
        # The engine runs in the pod's own working directory: hand it an absolute path.
        args.size = str(Path(args.size).resolve())
    workdir = Path(tempfile.mkdtemp(prefix="hotload-swap-bench-"))
    load_before = os.getloadavg()[0]
    try:
        report = asyncio.run(_run(args, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"
    report["load"] = [load_before, os.getloadavg()[0]]
    command = "python -m bench.swap.run_swap_bench " + " ".join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "results.md").write_text(_markdown(report, command.strip()))
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
