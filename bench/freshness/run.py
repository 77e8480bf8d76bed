"""Freshness across regions: how many steps behind the trainer each completion is.

Everything is real: three local regions (etcd, kube-apiserver, kwok, the pod runtime), each
with its own bucket (MinIO) behind an emulated WAN link (toxiproxy: rate and latency),
buckets replicated by MinIO, the chart installed with helm (the operator), a
RolloutDeployment of reference-engine replicas per region reading its own bucket. A
trainer takes a real AdamW step of the reference model every ``--interval`` seconds and
hands the weights to the publisher (home bucket replicated). Meanwhile a client per region
asks its region's Service for completions back to back; each completion names the
snapshot that served it, so

    lag = (the trainer's newest published step when the request was sent) - (served step)

is measured per completion, and quoted as p50 / p99 / max per region and overall (goal:
p99 <= 1). Three loops, one after the other, in the same process on the same regions
(``--runs`` picks some):

- ``deltas``: a delta at every step; every ``--full-every`` steps the step's weights also go
  out as a Full *beside* the chain (a checkpoint, the publisher's default), which later
  deltas name once it is in every region's bucket;
- ``deltas-full-in-chain``: the same, with ``checkpoints=False``: the cadence's step is a
  Full in the chain, and every delta after it waits behind it (the behaviour before
  checkpoints, the baseline for them);
- ``full-every-step``: a Full at every step (what a system without deltas ships).

``--full-every`` defaults to 10, not the publisher's 25: the cadence then comes due three
times in a 30-step run (at the publisher's 25, once, at its end), so each delta run shows
more than one scheduled Full. A checkpoint takes longer than a Full's time on one link:
its Full goes up one part at a time beside the deltas, then replication brings each region
its copy (the smoke run: 13 s at 1000 KB/s, as long as the Full in the chain there; about
a minute at the default 200 KB/s, some 13 steps of 5 s). The lane publishes one checkpoint
at a time, so when one is still on its way at the next cadence step, the next begins at
the first publish after it is complete; results.md counts those begun, completed and
still on their way at the end (``--steps 40`` leaves room for two to complete at 5 s
steps).

At production proportions by default: a Full takes several step intervals to cross the
link, as a 70B bf16 policy (140 GB) does over a 10 Gbit/s inter-region link (~112 s)
against a 10-30 s step. Here the model and the link are scaled down together: the small
reference model's 6.2 MB Full over 200 KB/s takes ~31 s against a 5 s step (~6 steps).
The trainer's encode runs in the loop (the publisher's worker, in the trainer's process:
it shares the trainer's cores), and each step records how long the training loop was held
by its publish call. A publisher that falls behind publishes the newest step and skips
the stale ones (docs/publishing.md): the results count the skipped steps. Each published
step records the checkpoint it began and the one it names, and each checkpoint when it was
complete, its seconds and bytes (results.md: the delta runs' scheduled Fulls).

    ~/.cache/hotload/venv/bin/python -m bench.freshness.run [--steps 30] [--interval 5] \
        [--full-every 10] [--runs deltas,deltas-full-in-chain,full-every-step] [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.freshness.report import report
from bench.freshness.summary import STEP_PATTERN, Sample, published_entry, summarize_run
from bench.load import LoadSampler
from hotload.errors import HotloadError
from hotload.local import down
from hotload.local.chart import ChartRelease
from hotload.local.fleets import FleetSpec, apply_fleet, complete
from hotload.local.lifecycle import LocalRegions
from hotload.local.reaper import start_reaper
from hotload.local.region import Region, RegionAddons, WanLink
from hotload.local.trainer import PolicyTrainer
from hotload.local.world import bring_up
from hotload.publish import Publisher, PublisherSettings

HERE = Path(__file__).resolve().parent
REGIONS = ("us-east", "eu-west", "ap-south")
#: The operator watches the bench's ``hl-*`` namespaces (a glob: the chart's cluster-wide mode).
BENCH_CHART = ChartRelease(watch_namespaces=("hl-*",), cluster_wide=True)


@dataclass(frozen=True)
class RunMode:
    """One of the bench's loops: the publisher's cadence and where its Full goes."""

    full_every: int | None
    """None: ``--full-every``."""
    checkpoints: bool


RUNS = {
    "deltas": RunMode(full_every=None, checkpoints=True),
    "deltas-full-in-chain": RunMode(full_every=None, checkpoints=False),
    "full-every-step": RunMode(full_every=1, checkpoints=False),
}
#: Between one client's requests: steady sampling without keeping a core busy.
PAUSE_S = 0.2


class NewestStep:
    """The trainer's newest published step, read by the clients' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.step = -1

    def set(self, step: int) -> None:
        with self._lock:
            self.step = step

    def get(self) -> int:
        with self._lock:
            return self.step


def _client(
    region: Region,
    spec: FleetSpec,
    newest: NewestStep,
    origin: float,
    stop: threading.Event,
    out: list[Sample],
    failures: list[str],
    run: str,
) -> None:
    while not stop.is_set():
        step_when_sent = newest.get()
        sent = time.monotonic()
        try:
            answer = complete(region, spec, "The policy", max_tokens=4, timeout_s=30)
        except HotloadError:
            failures.append(region.name)  # no answer: counted, never hidden
            time.sleep(0.5)
            continue
        match = STEP_PATTERN.search(answer.identity)
        if match is None or step_when_sent < 0:
            continue
        time.sleep(PAUSE_S)
        out.append(
            Sample(
                run,
                region.name,
                round(sent - origin, 3),
                step_when_sent,
                int(match[1]),
                answer.identity,
            )
        )


def run_loop(
    regions: LocalRegions,
    spec: FleetSpec,
    trainer: PolicyTrainer,
    files_from: Path,
    workdir: Path,
    *,
    run: str,
    steps: int,
    interval: float,
    full_every: int,
    checkpoints: bool,
    say: Any,
) -> tuple[list[Sample], list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """One measured loop: the first Full rolled out (not measured), then ``steps`` steps.

    A checkpoint still on its way when the loop ends is stopped when the publisher closes
    (results.md counts it as on its way at the end), so that the next run has the link."""
    names = regions.names
    settings = PublisherSettings(
        deployment=spec.name,
        contexts=tuple(names),
        workdir=workdir,
        namespace=spec.namespace,
        kubeconfig=regions.kubeconfig,
        identity_prefix=f"{run}-{secrets.token_hex(2)}",
        home=names[0],
        full_every=full_every,
        checkpoints=checkpoints,
        files_from=files_from,
        wait=False,
    )
    samples: list[Sample] = []
    failures: list[str] = []
    published: list[dict[str, Any]] = []
    newest = NewestStep()
    stop = threading.Event()
    # A step of its own first: the previous run may have ended on a Full at this step, and
    # a second Full at the same step does not move the target (the operator keeps the one
    # it has), so this run's first snapshot would never be served.
    trainer.train_step()
    with Publisher(settings) as publisher:
        start_step = trainer.step
        handle = publisher.publish(trainer.inference_state(), trainer.step, full=True)
        result = handle.result(timeout=900)
        say(f"[{run}] first snapshot {result.identity} applied; waiting until served everywhere")
        _wait_served(regions, spec, result.identity)
        origin = time.monotonic()
        newest.set(trainer.step)
        threads = [
            threading.Thread(
                target=_client,
                args=(region, spec, newest, origin, stop, samples, failures, run),
                daemon=True,
            )
            for region in regions.regions
        ]
        for thread in threads:
            thread.start()
        handles = []
        loop: list[dict[str, Any]] = []
        for number in range(1, steps + 1):
            due = origin + number * interval
            time.sleep(max(0.0, due - time.monotonic()))
            began = time.monotonic()
            trainer.train_step()
            trained = time.monotonic()
            handle = publisher.publish(trainer.inference_state(), trainer.step)
            newest.set(trainer.step)
            handles.append(handle)
            loop.append(
                {
                    "step": trainer.step,
                    "called_s": round(trained - origin, 3),
                    "train_s": round(trained - began, 4),
                    "blocked_s": round(handle.blocked_seconds, 4),
                    "late_s": round(max(0.0, began - due), 4),
                }
            )
            held_ms = handle.blocked_seconds * 1000
            say(f"[{run}] step {trainer.step - start_step}/{steps} published "
                f"(train {trained - began:.2f} s, blocked {held_ms:.1f} ms)")  # fmt: skip
        time.sleep(interval)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        seen: set[str] = set()
        for handle in handles:
            result = handle.result(timeout=900)
            if result.identity in seen:  # a skipped step's handle: its replacement's result
                continue
            seen.add(result.identity)
            called_s = next((e["called_s"] for e in loop if e["step"] == result.step), None)
            published.append(published_entry(result, called_s))
            if result.checkpoint_begun:
                say(f"[{run}] step {result.step - start_step} began {result.checkpoint_begun}")
            for done in result.checkpoint_done:
                outcome = "complete" if done.complete else f"failed ({done.error})"
                say(f"[{run}] {done.identity} {outcome} after {done.seconds:.1f} s "
                    f"(seen at step {result.step - start_step})")  # fmt: skip
    return samples, failures, published, loop


def _wait_served(
    regions: LocalRegions, spec: FleetSpec, identity: str, timeout: float = 900
) -> None:
    deadline = time.monotonic() + timeout
    pending = set(regions.names)
    while pending:
        for name in sorted(pending):
            try:
                if complete(regions.region(name), spec, "x", max_tokens=1).identity == identity:
                    pending.discard(name)
            except HotloadError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{identity} not served in {sorted(pending)}")
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--size", default="small", help="reference model size or config.json")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--wan-rate", type=int, default=200, help="KB/s")
    parser.add_argument("--wan-latency", type=int, default=25, help="ms, one way")
    parser.add_argument(
        "--full-every",
        type=int,
        default=10,
        help="the delta runs' cadence, in steps (the module doc says why 10)",
    )
    parser.add_argument(
        "--runs",
        type=_runs,
        default=list(RUNS),
        help=f"comma-separated, in the order to run (default: {','.join(RUNS)})",
    )
    parser.add_argument(
        "--baseline-steps", type=int, default=None, help="Full-every-step steps (default: --steps)"
    )
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--keep", action="store_true", help="leave the regions up")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite results.md from --out's results.json"
    )
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((args.out / "results.json").read_text())
        report(saved, saved["runs"], args.out)
        return
    command = " ".join(["python -m bench.freshness.run", *sys.argv[1:]])
    say = print

    state = Path(tempfile.mkdtemp(prefix="hotload-bench-freshness-"))
    addons = RegionAddons(
        object_storage=True,
        wan=WanLink(rate_kb_s=args.wan_rate, latency_ms=args.wan_latency),
        replication=True,
    )
    say(f"bringing up {len(REGIONS)} regions with buckets behind WAN links in {state}")
    # Should this process be killed, the reaper takes the regions down after it.
    reaper = None if args.keep else start_reaper(state)
    regions = bring_up(REGIONS, addons=addons, state_dir=state, index_base=221, chart=BENCH_CHART)
    try:
        import os

        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(regions.aws_credentials_file)
        os.environ["AWS_CONFIG_FILE"] = str(regions.aws_config_file)
        from kubernetes import client as k8s

        from hotload.local.bootstrap import api_client

        trainer = PolicyTrainer(state / "trainer", name="bench", size=args.size, lr=args.lr)
        # The replicas serve the trainer's architecture (the reference engine refuses others).
        spec = FleetSpec(
            name="policy",
            namespace="hl-bench-freshness",
            replicas=args.replicas,
            engine_args=("--model-config", trainer.model_config),
        )
        for region in regions.regions:
            api = api_client(region)
            try:
                k8s.CoreV1Api(api).create_namespace({"metadata": {"name": spec.namespace}})  # type: ignore[arg-type]
            finally:
                api.close()  # type: ignore[no-untyped-call]
            apply_fleet(region, spec)
        files = trainer.model_files(state / "model")
        params = sum(p.numel() for p in trainer.model.parameters())
        results: dict[str, Any] = {}
        raw: dict[str, list[Sample]] = {}
        for run in args.runs:
            mode = RUNS[run]
            steps = args.steps
            if run == "full-every-step" and args.baseline_steps:
                steps = args.baseline_steps
            with LoadSampler() as load:
                samples, failures, published, loop = run_loop(
                    regions, spec, trainer, files, state / f"publisher-{run}",
                    run=run, steps=steps, interval=args.interval,
                    full_every=mode.full_every or args.full_every, checkpoints=mode.checkpoints,
                    say=say,
                )  # fmt: skip
            results[run] = summarize_run(samples, failures, published, regions.names, loop)
            results[run]["load"] = load.summary()
            raw[run] = samples
            say(f"[{run}] lag in steps: {results[run]['overall']}")
        _write(args, command, params, results, raw)
    finally:
        if reaper is not None:
            down(state)
            reaper.terminate()


def _runs(value: str) -> list[str]:
    """``--runs``: names of RUNS, comma-separated."""
    runs = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in runs if name not in RUNS]
    if unknown or not runs:
        raise argparse.ArgumentTypeError(
            f"unknown run(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(RUNS)}"
        )
    return runs


def _write_samples(path: Path, raw: dict[str, list[Sample]]) -> None:
    """Every sample, compact (one row each: region, sent, newest step, served step)."""
    rows = {
        run: [[s.region, s.sent, s.newest_step, s.served_step] for s in samples]
        for run, samples in raw.items()
    }
    columns = ["region", "sent_s", "newest_step", "served_step"]
    payload = json.dumps({"columns": columns, "runs": rows}, separators=(",", ":"))
    path.write_bytes(gzip.compress(payload.encode(), mtime=0))


def _write(
    args: argparse.Namespace,
    command: str,
    params: int,
    results: dict[str, Any],
    raw: dict[str, list[Sample]],
) -> None:
    meta = {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "model": f"reference engine, size {args.size}, {params:,} parameters, AdamW lr {args.lr}",
        "wan": f"{args.wan_rate} KB/s each way, {args.wan_latency} ms one way, per region",
        "interval_s": args.interval,
        "replicas_per_region": args.replicas,
        "full_every": args.full_every,
        "run_settings": {
            run: {
                "full_every": RUNS[run].full_every or args.full_every,
                "checkpoints": RUNS[run].checkpoints,
            }
            for run in results
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({**meta, "runs": results}, indent=2) + "\n")
    _write_samples(args.out / "results-samples.json.gz", raw)
    report(meta, results, args.out)


if __name__ == "__main__":
    main()
