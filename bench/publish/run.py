"""Sharded publish: the same model and steps published by 1, 2 and 4 ranks.

    ~/.cache/hotload/venv/bin/python -m bench.publish.run [--ranks 1,2,4] [--steps 4]

Everything is real: one local region (etcd, kube-apiserver; no operator: the PolicySnapshots
are applied and nothing rolls them out) with a RolloutDeployment reading a ``file://``
bucket; a torch.distributed job per rank count (gloo on CPU, one process per rank), the
reference engine's Qwen2 architecture at ``--hidden``/``--layers`` sharded with FSDP2, real
AdamW steps at ``--lr`` (RL-like: most bf16 weights unchanged between steps); after every
step each rank hands ``model.state_dict()`` to its ``Publisher(distributed=True)``: a Full,
then deltas. The baseline, run in the same session: one process without FSDP publishing
the same model and steps through the single-process publisher.

Per rank and step: the encode's CPU seconds (the encoding thread's CPU time, one codec
thread) and wall seconds, the bytes it encoded and stored, the training loop's blocked time
(``publish`` until it returns), and the publish's wall time (``publish`` until every rank
has the outcome). The encoder's MB/s per core is bytes encoded / encode CPU seconds.
Medians over the deltas. This machine has few cores shared by other work: CPU seconds are
the figures that scale (~1/N per rank); wall times with more ranks than free cores do not.
Writes ``results.json`` and ``RESULTS.md`` here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hotload, whatever is installed

import kubernetes  # noqa: E402

from hotload.engines.reference import model as rm  # noqa: E402
from hotload.local import down, up  # noqa: E402
from hotload.local.bootstrap import api_client  # noqa: E402
from tests.fixtures.sharded_job import JobSpec, kill_job, launch  # noqa: E402
from tests.integration.chart.objects import idle_deployment_body  # noqa: E402

MB = 1e6
NAMESPACE = "bench-publish"
DEPLOYMENT = "bench"
INDEX_BASE = 241


def model_config(directory: Path, hidden: int, layers: int) -> Path:
    """A Qwen2 config of the reference engine's family at this size, with its files."""
    config = {
        **rm.SIZES["small"],
        "hidden_size": hidden,
        "intermediate_size": int(hidden * 2.75) // 64 * 64,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": 2,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "size.json").write_text(json.dumps(config))
    built = rm.build_config(directory / "size.json")
    rm.save_snapshot(rm.build_model(built), directory / "model")
    return directory / "model" / "config.json"


def run_job(spec: JobSpec, ranks: int) -> list[dict[str, Any]]:
    out = Path(spec.out)
    out.mkdir(parents=True)
    job = launch(spec, ranks, out)
    try:
        job.wait(timeout=3600)
    finally:
        kill_job(job)
    for rank in range(ranks):
        report = out / f"rank-{rank}.json"
        error = json.loads(report.read_text())["error"] if report.exists() else "no report"
        if error is not None or job.returncode:
            log = (out / f"rank-{rank}.log").read_text()[-3000:]
            raise RuntimeError(f"rank {rank} failed: {error}\n{log}")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]


def summarize(name: str, ranks: int, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank medians over the deltas, and the Full."""
    rows = []
    for report in reports:
        rank = report["rank"]
        full_row: dict[str, Any] = {}
        deltas: list[dict[str, Any]] = []
        for result, timing in zip(report["results"], report["timings"], strict=True):
            own = next((r for r in result["ranks"] if r["rank"] == rank), None)
            row = {
                "kind": result["kind"],
                "stored_bytes": own["storedBytes"] if own else result["storedBytes"],
                "tensor_bytes": own["tensorBytes"] if own else result["fullBytes"],
                "encode_s": own["encodeSeconds"] if own else result["encodeSeconds"],
                "encode_cpu_s": own["encodeCpuSeconds"] if own else None,
                "blocked_s": timing["blocked_s"],
                "publish_s": timing["publish_s"],
                "snapshot_bytes": result["storedBytes"],
            }
            if result["kind"] == "Full":
                full_row = row
            else:
                deltas.append(row)
        rows.append({"rank": rank, "full": full_row, "deltas": deltas, **_medians(deltas)})
    return {"run": name, "ranks": ranks, "per_rank": rows}


def _medians(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [d[key] for d in deltas if d[key] is not None]
        return statistics.median(values) if values else None

    cpu = median("encode_cpu_s")
    wall = median("encode_s")
    tensor = median("tensor_bytes") or 0
    return {
        "delta_encode_cpu_s": cpu,
        "delta_encode_s": wall,
        "delta_tensor_bytes": tensor,
        "delta_stored_bytes": median("stored_bytes"),
        "delta_blocked_s": median("blocked_s"),
        "delta_publish_s": median("publish_s"),
        "delta_snapshot_bytes": median("snapshot_bytes"),
        "encode_mb_s_per_core": tensor / MB / cpu if cpu else None,
        "encode_mb_s_wall": tensor / MB / wall if wall else None,
    }


def provenance(results: dict[str, Any]) -> str:
    """Which command, commit and machine made the results, and how busy it was."""
    when = f"{results['when']}, " if "when" in results else ""
    return (
        f"`{results['command']}` at {results['commit']} on {results['machine']} "
        f"({when}{results['seconds']} s, load average {results['load_average'][0]} before / "
        f"{results['load_average'][1]} after)"
    )


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# bench/publish: one model, published by 1, 2 and 4 ranks",
        "",
        provenance(results) + "; "
        f"model {results['model_params'] / 1e6:.1f}M parameters "
        f"({results['model_bytes'] / MB:.0f} MB bf16), {results['steps']} steps (a Full, then "
        f"deltas of real AdamW steps at lr {results['lr']}), one codec thread per rank.",
        "",
        "Medians over the deltas, per rank. *encode CPU* is the encoding thread's CPU time;"
        " *MB/s per core* is the bytes that rank encoded / that time; *blocked* is the"
        " training loop's wait in `publish`; *publish* is `publish` until the outcome.",
        "",
        "| run | ranks | rank | encoded MB | encode CPU s | MB/s per core | encode wall s"
        " | stored KB | blocked ms | publish s | snapshot KB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        for row in run["per_rank"]:
            lines.append(
                f"| {run['run']} | {run['ranks']} | {row['rank']} "
                f"| {row['delta_tensor_bytes'] / MB:.1f} "
                f"| {_fmt(row['delta_encode_cpu_s'], 3)} "
                f"| {_fmt(row['encode_mb_s_per_core'], 0)} "
                f"| {_fmt(row['delta_encode_s'], 3)} "
                f"| {(row['delta_stored_bytes'] or 0) / 1e3:.1f} "
                f"| {(row['delta_blocked_s'] or 0) * 1e3:.1f} "
                f"| {_fmt(row['delta_publish_s'], 2)} "
                f"| {(row['delta_snapshot_bytes'] or 0) / 1e3:.1f} |"
            )
    lines += ["", "## Against one rank", ""]
    for line in results["ratios"]:
        lines.append(f"- {line}")
    if results["encoder_results"]:
        lines += [
            "",
            "## The encoder's own measure",
            "",
            "bench/codec/ENCODE-RESULTS.md (the whole delta `encode()` of a real model,"
            " encoder engineer's run): " + results["encoder_results"],
        ]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratios(runs: list[dict[str, Any]]) -> list[str]:
    one = next(r for r in runs if r["run"] == "sharded" and r["ranks"] == 1)
    base_cpu = one["per_rank"][0]["delta_encode_cpu_s"]
    lines = []
    for run in runs:
        if run["run"] != "sharded" or run["ranks"] == 1:
            continue
        cpus = [row["delta_encode_cpu_s"] for row in run["per_rank"]]
        worst = max(cpus)
        lines.append(
            f"{run['ranks']} ranks: encode CPU per rank {min(cpus):.3f}-{worst:.3f} s "
            f"= {worst / base_cpu:.2f}x one rank's {base_cpu:.3f} s (ideal {1 / run['ranks']:.2f}x)"
        )
    single = next(r for r in runs if r["run"] == "single")
    s_row = single["per_rank"][0]
    lines.append(
        f"single-process publisher (baseline): encode wall {s_row['delta_encode_s']:.3f} s, "
        f"blocked {s_row['delta_blocked_s'] * 1e3:.1f} ms, snapshot "
        f"{s_row['delta_snapshot_bytes'] / 1e3:.1f} KB; one sharded rank: encode wall "
        f"{one['per_rank'][0]['delta_encode_s']:.3f} s, snapshot "
        f"{one['per_rank'][0]['delta_snapshot_bytes'] / 1e3:.1f} KB"
    )
    return lines


def encoder_results() -> str | None:
    """The encoder's own measure (bench/codec/ENCODE-RESULTS.md), when it is there."""
    path = ROOT / "bench" / "codec" / "ENCODE-RESULTS.md"
    if not path.is_file():
        return None
    rows = [line for line in path.read_text().splitlines() if line.startswith("| this checkout")]
    return "; ".join(rows) or None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args()
    command = "python -m bench.publish.run " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-publish-"))
    state = work / "regions"
    regions = up(["bench-1"], state_dir=state, index_base=INDEX_BASE)
    try:
        region = regions.regions[0]
        api = api_client(region)
        kubernetes.client.CoreV1Api(api).create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}  # type: ignore[arg-type]
        )
        config = model_config(work / "model", args.hidden, args.layers)
        model = rm.build_model(rm.build_config(config))
        params = sum(p.numel() for p in rm.parameters(model).values())
        del model
        runs = []
        plan = [("single", 1)] + [("sharded", int(n)) for n in args.ranks.split(",")]
        for name, ranks in plan:
            bucket = work / f"bucket-{name}-{ranks}"
            bucket.mkdir()
            deployment = f"{DEPLOYMENT}-{name}-{ranks}"
            body = idle_deployment_body(deployment)  # no replicas: nothing rolls out
            body["spec"]["hotLoad"]["bucketUrl"] = f"file://{bucket}"
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                "hotload.dev", "v1alpha1", NAMESPACE, "rolloutdeployments", body
            )
            spec = JobSpec(
                out=str(work / f"job-{name}-{ranks}"),
                workdir=str(work / f"publisher-{name}-{ranks}"),
                kubeconfig=str(regions.kubeconfig),
                contexts=[region.name],
                namespace=NAMESPACE,
                deployment=deployment,
                prefix=f"b{secrets.token_hex(2)}",
                files_from=str(config.parent),
                steps=list(range(args.steps)),
                lr=args.lr,
                wait=False,
                model=str(config),
                sharded=name == "sharded",
                oracle=False,
            )
            started = time.monotonic()
            reports = run_job(spec, ranks)
            print(f"{name} x{ranks}: {time.monotonic() - started:.0f} s", flush=True)
            runs.append(summarize(name, ranks, reports))
        api.close()  # type: ignore[no-untyped-call]
    finally:
        down(state)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    results = {
        "command": command,
        "commit": commit,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "model_params": params,
        "model_bytes": params * 2,
        "steps": args.steps,
        "lr": args.lr,
        "runs": runs,
        "ratios": ratios(runs),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.monotonic() - began),
        "encoder_results": encoder_results(),
        "notes": [],
    }
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (HERE / "RESULTS.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
