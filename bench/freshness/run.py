"""Freshness across regions: how many steps behind the trainer each completion is.

Everything is real: three local regions (etcd, kube-apiserver, kwok, the pod runtime), each
with its own bucket (MinIO) behind an emulated WAN link (toxiproxy: rate and latency),
buckets replicated by MinIO, the chart installed with helm (the operator), a
RolloutDeployment of reference-engine replicas per region reading its own bucket. A
trainer takes a real AdamW step of the reference model every ``--interval`` seconds and
hands the weights to the publisher (Full every 25 steps, deltas between, home bucket
replicated). Meanwhile a client per region asks its region's Service for completions
back to back; each completion names the snapshot that served it, so

    lag = (the trainer's newest published step when the request was sent) - (served step)

is measured per completion, and quoted as p50 / p99 / max per region and overall (goal:
p99 <= 1). The baseline, run in the same process on the same regions: the same loop
publishing a Full at every step (what a system without deltas ships).

At production proportions by default: a Full takes several step intervals to cross the
link, as a 70B bf16 policy (140 GB) does over a 10 Gbit/s inter-region link (~112 s)
against a 10-30 s step. Here the model and the link are scaled down together: the small
reference model's 6.2 MB Full over 200 KB/s takes ~31 s against a 5 s step (~6 steps).
The trainer's encode runs in the loop (the publisher's worker, in the trainer's process:
it shares the trainer's cores), and each step records how long the training loop was held
by its publish call. A publisher that falls behind publishes the newest step and skips
the stale ones (docs/publishing.md): the results count the skipped steps.

    ~/.cache/hotload/venv/bin/python -m bench.freshness.run [--steps 30] [--interval 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import re
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
STEP_PATTERN = re.compile(r"-step-(\d+)(?:-full|-lora)?$")
#: Between one client's requests: steady sampling without keeping a core busy.
PAUSE_S = 0.2


@dataclass(frozen=True)
class Sample:
    run: str
    region: str
    sent: float
    """Seconds since the run's first publish."""
    newest_step: int
    served_step: int
    identity: str

    @property
    def lag(self) -> int:
        return max(0, self.newest_step - self.served_step)


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


def _percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _summary(samples: list[Sample], failures: int) -> dict[str, Any]:
    lags = [s.lag for s in samples]
    if not lags:
        return {"completions": 0, "failed_requests": failures}
    return {
        "completions": len(lags),
        "failed_requests": failures,
        "p50": _percentile(lags, 0.50),
        "p99": _percentile(lags, 0.99),
        "max": max(lags),
        "share_at_lag_0": round(sum(1 for lag in lags if lag == 0) / len(lags), 3),
    }


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
    say: Any,
) -> tuple[list[Sample], list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """One measured loop: the first Full rolled out (not measured), then ``steps`` steps."""
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
        files_from=files_from,
        wait=False,
    )
    samples: list[Sample] = []
    failures: list[str] = []
    published: list[dict[str, Any]] = []
    newest = NewestStep()
    stop = threading.Event()
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
            published.append(
                {
                    "identity": result.identity,
                    "step": result.step,
                    "kind": result.kind.value,
                    "stored_bytes": result.stored_bytes,
                    "blocked_ms": round(result.blocked_seconds * 1000, 2),
                    "encode_s": result.encode_seconds,
                    "seconds": result.seconds,
                    "skipped_steps": result.skipped_steps,
                    "outcomes": {c: r.outcome.value for c, r in result.regions.items()},
                }
            )
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
        for run, full_every, steps in (
            ("deltas", 25, args.steps),
            ("full-every-step", 1, args.baseline_steps or args.steps),
        ):
            with LoadSampler() as load:
                samples, failures, published, loop = run_loop(
                    regions, spec, trainer, files, state / f"publisher-{run}",
                    run=run, steps=steps, interval=args.interval, full_every=full_every, say=say,
                )  # fmt: skip
            results[run] = summarize_run(samples, failures, published, regions.names)
            results[run]["training_loop"] = loop
            results[run]["load"] = load.summary()
            raw[run] = samples
            say(f"[{run}] lag in steps: {results[run]['overall']}")
        _write(args, command, params, results, raw)
    finally:
        if reaper is not None:
            down(state)
            reaper.terminate()


def summarize_run(
    samples: list[Sample], failures: list[str], published: list[dict[str, Any]], names: list[str]
) -> dict[str, Any]:
    """What results.json keeps of one run: percentiles, a histogram of the lags and, per
    region, the seconds from each step's publish to its first completion (the raw samples
    go, compressed, to results-samples.json.gz)."""
    as_dicts = [asdict(s) for s in samples]
    histogram: dict[str, int] = {}
    for sample in samples:
        histogram[str(sample.lag)] = histogram.get(str(sample.lag), 0) + 1
    return {
        "overall": _summary(samples, len(failures)),
        "by_region": {
            name: _summary([s for s in samples if s.region == name], failures.count(name))
            for name in names
        },
        "lag_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
        "serve_seconds": {name: serve_seconds(as_dicts, name) for name in names},
        "published": published,
    }


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
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({**meta, "runs": results}, indent=2) + "\n")
    _write_samples(args.out / "results-samples.json.gz", raw)
    report(meta, results, args.out)


def serve_seconds(samples: list[dict[str, Any]], region: str) -> list[float]:
    """Per step: seconds from its publish to the first request of ``region`` it served.

    Both ends come from the samples: the publish is the first request (any region) sent
    knowing the step (within one request's round, ~0.3 s, after the real publish), the
    serve the first request of the region that the step (or a newer one) answered.
    """
    steps = sorted({s["newest_step"] for s in samples})
    seconds = []
    for step in steps[1:]:  # the first was served before the clients started
        known = [s["sent"] for s in samples if s["newest_step"] >= step]
        served = [s["sent"] for s in samples if s["region"] == region and s["served_step"] >= step]
        if known and served:
            seconds.append(round(max(0.0, min(served) - min(known)), 3))
    return seconds


def report(meta: dict[str, Any], results: dict[str, Any], out: Path) -> None:
    """results.md from the run's metadata and results (``--report-only`` rereads them)."""
    command = meta["command"]
    lines = [
        "# Freshness benchmark: lag in steps per completion, three regions",
        "",
        f"Command: `{command}`  ",
        f"Date: {meta['date']}  ",
        f"Machine: {meta['machine']}  ",
        f"Model: {meta['model']}  ",
        f"WAN: {meta['wan']}; buckets replicated from the home region (MinIO).  ",
        f"A step every {meta['interval_s']:.0f} s; {meta['replicas_per_region']} reference "
        "replica(s) per region; "
        "a client per region asks for completions back to back.",
        "",
        "lag = the trainer's newest published step when the request was sent - the step of the "
        "snapshot that served it (named by the response). Goal: p99 <= 1.",
        "",
        "| run | region | completions | p50 | p99 | max | share at lag 0 | failed requests |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, data in results.items():
        rows = [("all", data["overall"]), *data["by_region"].items()]
        for region, summary in rows:
            lines.append(
                f"| {run} | {region} | {summary.get('completions', 0)} | {summary.get('p50', '-')} "
                f"| {summary.get('p99', '-')} | {summary.get('max', '-')} "
                f"| {summary.get('share_at_lag_0', '-')} | {summary.get('failed_requests', 0)} |"
            )
    verdicts = []
    for run, data in results.items():
        p99s = [data["overall"].get("p99"), *(r.get("p99") for r in data["by_region"].values())]
        worst = max((v for v in p99s if v is not None), default=None)
        silent = [name for name, r in data["by_region"].items() if not r.get("completions")]
        met = worst is not None and worst <= 1 and not silent
        verdicts.append(
            f"`{run}`: worst p99 {worst} step(s)"
            + (f", no completions in {', '.join(silent)}" if silent else "")
            + f": goal {'met' if met else 'NOT met'}"
        )
    lines += ["", "Goal p99 <= 1 (overall and in every region): " + "; ".join(verdicts) + "."]
    lines += [
        "",
        "Completions by lag (steps: count): "
        + "; ".join(
            f"`{run}` " + ", ".join(f"{lag}: {n}" for lag, n in data["lag_histogram"].items())
            for run, data in results.items()
        )
        + ".",
    ]
    lines += [
        "",
        "Why: publish -> the first completion a region serves from the new step, seconds "
        "(median / max over the steps; from the samples, so within one request's round):",
        "",
        "| run | " + " | ".join(next(iter(results.values()))["by_region"]) + " |",
        "|---|" + "---|" * len(next(iter(results.values()))["by_region"]),
    ]
    for run, data in results.items():
        cells = []
        for region in data["by_region"]:
            seconds = sorted(data["serve_seconds"][region])
            cells.append(
                f"{seconds[len(seconds) // 2]:.2f} / {seconds[-1]:.2f}" if seconds else "-"
            )
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    rate = int(str(meta["wan"]).split()[0]) * 1000  # bytes/s, "<KB/s> KB/s each way, …"
    floors = []
    for run, data in results.items():
        kinds = [p["kind"] for p in data["published"]]
        if not kinds:
            continue
        usual = max(set(kinds), key=kinds.count)  # a run's Fulls or its deltas
        v = sorted(p["stored_bytes"] for p in data["published"] if p["kind"] == usual)
        floors.append(
            f"`{run}` {usual} median {v[len(v) // 2]:,} B ({v[len(v) // 2] / rate:.3f} s)"
        )
    full_link_s = [
        p["stored_bytes"] / rate
        for data in results.values()
        for p in data["published"]
        if p["kind"] == "Full"
    ]
    if full_link_s:
        crossing = sorted(full_link_s)[len(full_link_s) // 2]
        lines += [
            "",
            f"Snapshot sizes and their time on one link alone: {', '.join(floors)}. A Full "
            f"needs {crossing:.1f} s on the link, {crossing / meta['interval_s']:.1f} step "
            "intervals (a 70B bf16 policy over a 10 Gbit/s link: ~112 s, 4-11 steps of "
            "10-30 s).",
        ]
    lines += _loop_table(results)
    analysis = Path(__file__).with_name("analysis.md")
    if analysis.exists():  # how to read this run, written beside its results
        lines += ["", analysis.read_text().rstrip()]
    lines += [
        "",
        "Baseline (same regions, same process): `full-every-step` publishes a Full at every "
        "step, as a system without deltas would.",
        "",
        "The machine is shared (2 cores, other work running): read the numbers as an order of "
        "magnitude. Every sample (region, sent, newest step, served step) is in "
        "`results-samples.json.gz`.",
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def _loop_table(results: dict[str, Any]) -> list[str]:
    """The trainer's side of each run: what was published, what was skipped, and how long
    the training loop was held by each publish call."""
    lines = [
        "",
        "The trainer's side (the training loop calls `publish` once per step; the encode and "
        "uploads run on the publisher's worker thread in the same process):",
        "",
        "| run | steps | snapshots published | steps skipped (publisher behind) "
        "| loop blocked per step: median / max | train step median | publish call → "
        "outcome known, median / max | machine load (1 min) median / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, data in results.items():
        loop = data.get("training_loop") or []
        published = data["published"]
        skipped = sum(len(p.get("skipped_steps") or []) for p in published)
        blocked = [entry["blocked_s"] * 1000 for entry in loop]
        trained = [entry["train_s"] for entry in loop]
        seconds = [p["seconds"] for p in published if p.get("seconds") is not None]
        load = data.get("load") or {}
        lines.append(
            f"| {run} | {len(loop)} | {len(published)} | {skipped} "
            f"| {_median(blocked):.1f} / {max(blocked, default=float('nan')):.1f} ms "
            f"| {_median(trained):.2f} s "
            f"| {_median(seconds):.1f} / {max(seconds, default=float('nan')):.1f} s "
            f"| {load.get('load1_median', '-')} / {load.get('load1_max', '-')} |"
        )
    return lines


if __name__ == "__main__":
    main()
