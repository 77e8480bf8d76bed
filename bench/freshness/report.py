"""results.md of bench/freshness, from results.json's metadata and runs (``run.py`` writes
it after a run, and again with ``--report-only``). How to read a run is written by hand
in analysis.md, beside the results, and included when the report is bench/freshness's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.freshness.summary import median, scheduled_full_row, scheduled_fulls

HERE = Path(__file__).resolve().parent

#: What each run is, for the report's footnote.
RUN_MEANING = {
    "deltas": "a delta at every step; at the cadence's step the delta's weights also go out "
    "as a Full *beside* the chain (a checkpoint: the publisher's default), and later deltas "
    "name it once it is in every region's bucket",
    "deltas-full-in-chain": "a delta at every step but the cadence's, which is a Full in the "
    "chain (`checkpoints=False`: the behaviour before checkpoints)",
    "full-every-step": "a Full at every step, as a system without deltas would",
}


def report(meta: dict[str, Any], results: dict[str, Any], out: Path) -> None:
    """results.md from the run's metadata and results (``--report-only`` rereads them)."""
    command = meta["command"]
    cadence = meta.get("full_every")
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
        "a client per region asks for completions back to back."
        + (f" The delta runs' cadence: a Full every {cadence} steps." if cadence else ""),
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
    lines += _serve_table(results)
    lines += _sizes(meta, results)
    lines += _loop_table(results)
    lines += _scheduled_fulls_tables(results)
    analysis = HERE / "analysis.md"
    if analysis.exists() and out.resolve() == HERE:  # how to read this run, written beside it
        lines += ["", analysis.read_text().rstrip()]
    lines += [
        "",
        "The runs (same regions, same process, one after the other): "
        + "; ".join(f"`{run}`: {_meaning(meta, run)}" for run in results)
        + ".",
        "",
        "The machine (2 cores) may be shared: its load during each run is in the trainer's "
        "table; read the numbers as an order of magnitude. Every sample (region, sent, "
        "newest step, served step) is in `results-samples.json.gz`.",
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _meaning(meta: dict[str, Any], run: str) -> str:
    """What ``run`` published: from its settings where results.json keeps them (an older
    one does not, and its ``deltas`` had the Full in the chain)."""
    settings = (meta.get("run_settings") or {}).get(run)
    if settings is None:
        return RUN_MEANING.get(run, run) if run != "deltas" else RUN_MEANING["deltas-full-in-chain"]
    if settings["full_every"] == 1:
        return RUN_MEANING["full-every-step"]
    return RUN_MEANING["deltas" if settings["checkpoints"] else "deltas-full-in-chain"]


def _serve_table(results: dict[str, Any]) -> list[str]:
    regions = list(next(iter(results.values()))["by_region"])
    lines = [
        "",
        "Why: publish -> the first completion a region serves from the new step, seconds "
        "(median / max over the steps; from the samples, so within one request's round):",
        "",
        "| run | " + " | ".join(regions) + " |",
        "|---|" + "---|" * len(regions),
    ]
    for run, data in results.items():
        cells = []
        for region in regions:
            seconds = sorted(data["serve_seconds"][region])
            cells.append(
                f"{seconds[len(seconds) // 2]:.2f} / {seconds[-1]:.2f}" if seconds else "-"
            )
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return lines


def _sizes(meta: dict[str, Any], results: dict[str, Any]) -> list[str]:
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
    full_bytes = [
        p["stored_bytes"]
        for data in results.values()
        for p in data["published"]
        if p["kind"] == "Full"
    ] + [
        c["stored_bytes"]
        for data in results.values()
        for c in _fulls(data)["beside_the_chain"]
        if c.get("stored_bytes")
    ]
    if not full_bytes:
        return []
    crossing = sorted(full_bytes)[len(full_bytes) // 2] / rate
    return [
        "",
        f"Snapshot sizes and their time on one link alone: {', '.join(floors)}. A Full "
        f"needs {crossing:.1f} s on the link, {crossing / meta['interval_s']:.1f} step "
        "intervals (a 70B bf16 policy over a 10 Gbit/s link: ~112 s, 4-11 steps of "
        "10-30 s).",
    ]


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
            f"| {median(blocked):.1f} / {max(blocked, default=float('nan')):.1f} ms "
            f"| {median(trained):.2f} s "
            f"| {median(seconds):.1f} / {max(seconds, default=float('nan')):.1f} s "
            f"| {load.get('load1_median', '-')} / {load.get('load1_max', '-')} |"
        )
    return lines


def _fulls(data: dict[str, Any]) -> dict[str, Any]:
    """A run's scheduled Fulls (recomputed for a results.json written before they were kept)."""
    kept = data.get("scheduled_fulls")
    return kept if kept is not None else scheduled_fulls(data["published"])  # no call times


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _scheduled_fulls_tables(results: dict[str, Any]) -> list[str]:
    """The delta runs' scheduled Fulls: a line per run, then one per Full."""
    delta_runs = {
        run: data
        for run, data in results.items()
        if any(p["kind"] == "Incremental" for p in data["published"])
    }
    if not delta_runs:
        return []
    lines = [
        "",
        "The delta runs' scheduled Fulls: beside the chain (a checkpoint: the step goes out "
        "as a delta, its weights as a Full on a lane of their own; complete = in every "
        "region's bucket, so later deltas name it) or in the chain (every later delta waits "
        "behind it). Seconds: the checkpoint lane's, from its start (once its step's delta is "
        "delivered) to complete; for a Full in the chain, from the publish call to every "
        "region's outcome. Meanwhile: steps published while a checkpoint was on its way (none "
        "of them waits for it), or steps the training loop handed over while a Full in the "
        "chain was on its way (each waited behind it, or was skipped).",
        "",
        "| run | where | begun | completed | failed attempts | on its way at the end "
        "| seconds to complete, median / max | steps meanwhile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, data in delta_runs.items():
        row = scheduled_full_row(_fulls(data))
        lines.append(
            f"| {run} | {row['where']} | {row['begun']} | {row['completed']} "
            f"| {row['failed_attempts']} | {row['on_its_way_at_end']} "
            f"| {_seconds(row['seconds_median'])} / {_seconds(row['seconds_max'])} "
            f"| {row['steps_meanwhile']} |"
        )
    for run, data in delta_runs.items():
        fulls = _fulls(data)
        if fulls["beside_the_chain"]:
            lines += [
                "",
                f"`{run}`, each checkpoint (times in seconds since the run's first publish):",
                "",
                "| checkpoint | step | lane started | complete at | seconds | bytes | attempts "
                "| first delta naming it | steps published while on its way |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for c in fulls["beside_the_chain"]:
                lines.append(
                    f"| `{c['identity']}` | {c['step']} | {_seconds(c['begun_s'])} "
                    f"| {_seconds(c['complete_s']) if c['complete'] else 'not complete'} "
                    f"| {_seconds(c['seconds'])} "
                    f"| {_bytes(c['stored_bytes'])} "
                    f"| {c['attempts']} | {c['first_named_by_step'] or '-'} "
                    f"| {_steps(c['published_while_on_its_way'])} |"
                )
        if fulls["in_the_chain"]:
            lines += [
                "",
                f"`{run}`, each Full in the chain:",
                "",
                "| Full | step | seconds (publish call → outcome) | bytes | every region ok "
                "| steps handed over while on its way | of them skipped |",
                "|---|---|---|---|---|---|---|",
            ]
            for f in fulls["in_the_chain"]:
                lines.append(
                    f"| `{f['identity']}` | {f['step']} | {_seconds(f['seconds'])} "
                    f"| {f['stored_bytes']:,} | {'yes' if f['complete'] else 'no'} "
                    f"| {_steps(held) if (held := f.get('held_behind_it')) is not None else '-'} "
                    f"| {_steps(f['skipped_behind_it'])} |"
                )
    return lines


def _bytes(value: int | None) -> str:
    return f"{value:,}" if value else "-"


def _steps(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{len(steps)} ({steps[0]}-{steps[-1]})" if len(steps) > 1 else f"1 ({steps[0]})"
