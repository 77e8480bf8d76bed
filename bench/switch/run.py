"""Coordinated switch against independent swaps, three regions, in one run.

Everything is real: three local regions (etcd, kube-apiserver, kwok, the pod runtime), each
with its own bucket (MinIO, replicated from the home region), the chart installed with
helm (the operator), and per region two RolloutDeployments of reference-engine replicas in
two namespaces: one with ``spec.rollout.switch: Independent`` (the baseline: each replica
swaps as soon as it is ready), one with ``Coordinated`` (every replica of every region
stages, the publisher commits one instant, every engine swaps at it; docs/operator.md,
"Coordinated switch"). A trainer takes real AdamW steps of the reference model; the rounds
alternate between the two deployments (Independent, then Coordinated, per round), each a
delta published by that deployment's own publisher, so both see the same machine.

Per round, three figures (every answer is kept in results.json: region, sent and received
in seconds after the publish call, the identity that served it):

- spread: max - min of the engines' own switch instants for the new snapshot, read from
  each engine's ``swap_log`` (``/admin/identity``), not from the sidecars' reports;
- mixed window: how long clients saw both policies. Clients in each region ask their region's
  Service for completions back to back throughout the round; each response names its
  policy (``--clients`` of them per region: their request round bounds the resolution).
  window = max(0, last response naming the old policy - first naming the new),
  each response placed at the middle of its request;
- freshness: the publish call -> the last engine's swap (all serving), and -> the first.

Medians per mode and the ratio Coordinated / Independent, the machine's load beside them.

    ~/.cache/hotload/venv/bin/python -m bench.switch.run [--rounds 3] [--replicas 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from bench.freshness.run import BENCH_CHART, REGIONS, _wait_served
from bench.load import LoadSampler
from bench.transfer.run import _namespace
from hotload.errors import HotloadError
from hotload.local import down
from hotload.local.bootstrap import api_client
from hotload.local.fleets import (
    FIELD_MANAGER,
    FleetSpec,
    apply_fleet,
    complete,
    engine_urls,
    regional_deployment,
    swap_record,
)
from hotload.local.lifecycle import LocalRegions
from hotload.local.reaper import start_reaper
from hotload.local.region import Region, RegionAddons
from hotload.local.trainer import PolicyTrainer
from hotload.local.world import bring_up
from hotload.publish import Publisher, PublisherSettings
from hotload.waiting import wait_until

HERE = Path(__file__).resolve().parent
MODES = ("Independent", "Coordinated")
#: Between one client's requests: dense sampling without keeping a core busy.
PAUSE_S = 0.02


@dataclass(frozen=True)
class Answer:
    region: str
    sent: float
    """Wall clock (time.time()) when the request was sent."""
    received: float
    identity: str

    @property
    def middle(self) -> float:
        return (self.sent + self.received) / 2


def _client(
    region: Region, spec: FleetSpec, stop: threading.Event, out: list[Answer], failures: list[str]
) -> None:
    while not stop.is_set():
        sent = time.time()
        try:
            answer = complete(region, spec, "The policy", max_tokens=1, timeout_s=30)
        except HotloadError:
            failures.append(region.name)  # no answer: counted, never hidden
            time.sleep(0.2)
            continue
        out.append(Answer(region.name, sent, time.time(), answer.identity))
        time.sleep(PAUSE_S)


def _swaps(
    regions: LocalRegions, namespace: str, identity: str, replicas: int
) -> list[dict[str, Any]]:
    """Each engine's own record of its swap to ``identity``; empty until every engine of
    every region has one."""
    records = []
    for region in regions.regions:
        urls = engine_urls(region, namespace)
        if len(urls) < replicas:
            return []
        for pod, url in urls.items():
            found = swap_record(url, identity)
            if found is None:
                return []
            records.append({"region": region.name, "pod": pod, **found})
    return records


def _coordinate(region: Region, spec: FleetSpec, lead_ms: int) -> None:
    """The region's deployment with ``spec.rollout.switch: Coordinated``."""
    body = regional_deployment(region, spec)
    body["spec"]["rollout"] = {"switch": "Coordinated", "leadMilliseconds": lead_ms}
    api = api_client(region)
    try:
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
            "hotload.dev", "v1alpha1", spec.namespace, "rolloutdeployments", spec.name,
            body, field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
    finally:
        api.close()  # type: ignore[no-untyped-call]


def measure_round(
    regions: LocalRegions,
    spec: FleetSpec,
    publisher: Publisher,
    trainer: PolicyTrainer,
    old: str,
    *,
    clients: int,
    timeout_s: float,
) -> dict[str, Any]:
    """One delta published while clients ask every region; the figures of this round."""
    answers: list[Answer] = []
    failures: list[str] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client, args=(r, spec, stop, answers, failures), daemon=True)
        for r in regions.regions
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # every client is answered with the old policy before the publish
    trainer.train_step()
    published = time.time()
    result = publisher.publish(trainer.inference_state(), trainer.step).result(timeout=timeout_s)
    new = result.identity
    records = wait_until(lambda: _swaps(regions, spec.namespace, new, spec.replicas), timeout_s)
    if not records:
        stop.set()
        raise TimeoutError(f"{new} not swapped in every engine of {spec.namespace}")
    time.sleep(1.5)  # clients see the last engines' answers
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    instants = [float(r["at"]) for r in records]
    news = [a.middle for a in answers if a.identity == new]
    olds = [a.middle for a in answers if a.identity == old]
    window = max(0.0, max(olds) - min(news)) if news and olds else None
    switch = result.switch
    return {
        "identity": new,
        "old": old,
        "spread_ms": round((max(instants) - min(instants)) * 1000, 2),
        "mixed_window_ms": None if window is None else round(window * 1000, 1),
        "freshness_all_s": round(max(instants) - published, 3),
        "freshness_first_s": round(min(instants) - published, 3),
        "publish_result_s": result.seconds,
        "switch_at": None if switch is None else switch.at,
        "decision": None if switch is None else switch.decision.value,
        "swaps": records,
        "answer_rows": [
            [a.region, round(a.sent - published, 3), round(a.received - published, 3), a.identity]
            for a in answers
        ],
        "answers": len(answers),
        "answers_other": sum(1 for a in answers if a.identity not in (old, new)),
        "failed_requests": len(failures),
        "client_round_ms_median": round(
            statistics.median([(a.received - a.sent) * 1000 for a in answers]), 1
        )
        if answers
        else None,
    }


def window_bounds(row: dict[str, Any]) -> tuple[float, float] | None:
    """The mixed window's bounds from the answers (ms): at least last old sent - first new
    received (both policies were surely served then), at most last old received - first
    new sent. Each answer's request round (hundreds of ms on a loaded machine) separates
    them."""
    olds = [a for a in row.get("answer_rows", []) if a[3] == row["old"]]
    news = [a for a in row.get("answer_rows", []) if a[3] == row["identity"]]
    if not olds or not news:
        return None
    lower = max(a[1] for a in olds) - min(a[2] for a in news)
    upper = max(a[2] for a in olds) - min(a[1] for a in news)
    return round(max(0.0, lower) * 1000, 1), round(max(0.0, upper) * 1000, 1)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    for rows in rounds.values():
        for row in rows:
            bounds = window_bounds(row)
            row["mixed_window_lower_ms"] = None if bounds is None else bounds[0]
            row["mixed_window_upper_ms"] = None if bounds is None else bounds[1]
    keys = (
        "spread_ms",
        "mixed_window_ms",
        "mixed_window_lower_ms",
        "mixed_window_upper_ms",
        "freshness_all_s",
        "freshness_first_s",
    )
    medians = {
        mode: {k: _median([r[k] for r in rows]) for k in keys} for mode, rows in rounds.items()
    }
    ratios: dict[str, float | None] = {}
    for key in keys:
        base, coord = medians["Independent"][key], medians["Coordinated"][key]
        ratios[key] = round(coord / base, 3) if base and coord is not None else None
    return {"medians": medians, "ratio_coordinated_over_independent": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured deltas per mode")
    parser.add_argument("--replicas", type=int, default=2, help="per region and mode")
    parser.add_argument("--clients", type=int, default=2, help="concurrent clients per region")
    parser.add_argument("--size", default="small", help="reference model size")
    parser.add_argument("--lead-ms", type=int, default=2000, help="Coordinated leadMilliseconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="s per round")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite --out's RESULTS.md from results.json"
    )
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((args.out / "results.json").read_text())
        saved.update(summarize(saved["rounds"]))
        (args.out / "results.json").write_text(json.dumps(saved, indent=2) + "\n")
        report(saved, args.out)
        return
    command = " ".join(["python -m bench.switch.run", *sys.argv[1:]])
    state = Path(tempfile.mkdtemp(prefix="hotload-bench-switch-"))
    print(f"bringing up {len(REGIONS)} regions with buckets in {state}", flush=True)
    reaper = start_reaper(state)  # should this process be killed, the regions go after it
    addons = RegionAddons(object_storage=True, replication=True)
    regions = bring_up(REGIONS, addons=addons, state_dir=state, index_base=241, chart=BENCH_CHART)
    try:
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(regions.aws_credentials_file)
        os.environ["AWS_CONFIG_FILE"] = str(regions.aws_config_file)
        trainer = PolicyTrainer(state / "trainer", name="bench", size=args.size, lr=1e-6)
        files = trainer.model_files(state / "model")
        token = secrets.token_hex(2)
        specs = {
            mode: FleetSpec(
                name="policy",
                namespace=f"hl-switch-{mode.lower()}-{token}",
                replicas=args.replicas,
                engine_args=("--model-config", trainer.model_config),
            )
            for mode in MODES
        }
        for mode, spec in specs.items():
            _namespace(regions, spec.namespace)
            for region in regions.regions:
                apply_fleet(region, spec)
                if mode == "Coordinated":
                    _coordinate(region, spec, args.lead_ms)
        publishers = {
            mode: Publisher(
                PublisherSettings(
                    deployment=spec.name,
                    contexts=tuple(regions.names),
                    workdir=state / f"publisher-{mode}",
                    namespace=spec.namespace,
                    kubeconfig=regions.kubeconfig,
                    identity_prefix=f"{mode[:3].lower()}-{token}",
                    home=regions.names[0],
                    full_every=1000,
                    files_from=files,
                    wait=True,
                    wait_timeout_s=args.timeout,
                )
            )
            for mode, spec in specs.items()
        }
        current: dict[str, str] = {}
        rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        try:
            for mode in MODES:  # the first Full, not measured: nothing was served before it
                handle = publishers[mode].publish(
                    trainer.inference_state(), trainer.step, full=True
                )
                current[mode] = handle.result(timeout=args.timeout).identity
                _wait_served(regions, specs[mode], current[mode], timeout=args.timeout)
                print(f"[{mode}] {current[mode]} served everywhere", flush=True)
            with LoadSampler() as load:
                for number in range(1, args.rounds + 1):
                    for mode in MODES:
                        row = measure_round(
                            regions, specs[mode], publishers[mode], trainer, current[mode],
                            clients=args.clients, timeout_s=args.timeout,
                        )  # fmt: skip
                        current[mode] = row["identity"]
                        rounds[mode].append(row)
                        print(
                            f"[{mode}] round {number}: spread {row['spread_ms']} ms, mixed "
                            f"{row['mixed_window_ms']} ms, all serving {row['freshness_all_s']} s",
                            flush=True,
                        )
        finally:
            for publisher in publishers.values():
                publisher.close()
        results = {
            "command": command,
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "replicas_per_region_per_mode": args.replicas,
            "clients_per_region": args.clients,
            "regions": list(regions.names),
            "lead_ms": args.lead_ms,
            "load": load.summary(),
            **summarize(rounds),
            "rounds": rounds,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        report(results, args.out)
    finally:
        down(state)
        reaper.terminate()


def _longest_ms(row: dict[str, Any]) -> float | None:
    """The round's slowest answer (a replica that held requests while it swapped)."""
    rounds = [received - sent for _, sent, received, _ in row.get("answer_rows", [])]
    return round(max(rounds) * 1000, 1) if rounds else None


def report(results: dict[str, Any], out: Path) -> None:
    """RESULTS.md from results.json's content."""
    load = results["load"]
    lines = [
        "# Coordinated switch against independent swaps, three regions",
        "",
        f"Command: `{results['command']}`  ",
        f"Date: {results['date']}  ",
        f"Machine: {results['machine']}; load average (1 min) during the rounds: median "
        f"{load['load1_median']}, min {load['load1_min']}, max {load['load1_max']}  ",
        f"Regions: {', '.join(results['regions'])}; {results['replicas_per_region_per_mode']} "
        "reference-engine replicas per region and mode; "
        f"{results.get('clients_per_region', 1)} clients per region; Coordinated lead "
        f"{results['lead_ms']} ms. Rounds alternate Independent / Coordinated in one process.",
        "",
        "| mode | round | spread of engine swap instants (ms) | mixed window seen by clients "
        "(ms) [bounds] | publish → first engine swapped (s) | publish → all swapped (s) | answers "
        "| longest answer (ms) | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, rows in results["rounds"].items():
        for number, row in enumerate(rows, 1):
            lines.append(
                f"| {mode} | {number} | {row['spread_ms']} | {row['mixed_window_ms']} "
                f"[{row.get('mixed_window_lower_ms')}, {row.get('mixed_window_upper_ms')}] "
                f"| {row['freshness_first_s']} | {row['freshness_all_s']} | {row['answers']} "
                f"| {_longest_ms(row)} | {row['failed_requests']} |"
            )
    medians, ratios = results["medians"], results["ratio_coordinated_over_independent"]
    lines += ["", "| median | " + " | ".join(MODES) + " | Coordinated / Independent |"]
    lines += ["|---|---|---|---|"]
    for key in ratios:
        cells = " | ".join(str(medians[mode][key]) for mode in MODES)
        lines.append(f"| {key} | {cells} | {ratios[key]} |")
    lines += [
        "",
        "spread: max - min of the engines' own swap instants (`swap_log` of `/admin/identity`),"
        " one host clock. mixed window: last response naming the old policy - first naming the"
        " new (each at the middle of its request), clients in each region asking back to back. "
        "freshness: the publish call -> the engines' swap instants. The machine is shared "
        "(2 cores, other work running): read the numbers as an order of magnitude.",
    ]
    analysis = out / "analysis.md"
    if analysis.exists():  # how to read this run, written beside its results
        lines += ["", analysis.read_text().rstrip()]
    (out / "RESULTS.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
