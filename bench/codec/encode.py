"""The encoder's speed on real lr 1e-6 steps: this checkout against an earlier one, in one process.

    ~/.cache/hotload/venv/bin/python bench/codec/encode.py [--baseline d2baf31] [--steps 10]
        [--seed 1] [--reps 3] [--work /dev/shm/<dir>] [--out bench/codec]

Fine-tunes all-MiniLM-L6-v2 (``training.py``: Adam at lr 1e-6, a bf16 snapshot after every
step; kept in ``--work`` and reused; seed 1 by default: held-out steps, the encoder was
tuned on seed 0's), then for every adjacent pair runs the whole delta
``encode()`` a publisher runs per snapshot (map both directories, hash every previous
tensor for the chain's digest, per tensor diff, classify, entropy-code and hash, write and
sha256 the delta file, the manifest) with the earlier commit's package (``--baseline``,
built beside this one by ``baseline_package.py``) and with this checkout, alternating, at
1 and 2 threads, ``--reps`` times each. Every snapshot directory the two write must be
byte-identical. MB/s per core = full tensor bytes / CPU seconds of the process (what the
cores spent, whatever else ran on the machine); wall-clock MB/s beside it. A profile of
one encode per pair (CPU time per stage, each stage timed where it is called) says where
the cycles go in each. Writes ``encode-results.json`` and ``ENCODE-RESULTS.md``.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's hotload, whatever is installed

import training  # noqa: E402
from baseline_package import load_baseline  # noqa: E402

MB = 1e6

#: Stages timed in each package: (label, module, attribute), each where it is called, so
#: no stage contains another. What they leave out is the Python between them, small numpy
#: calls, file writes and the manifest.
STAGES = {
    "baseline": [
        ("hash tensors (xxh3-128)", "snapshot.encoder", "tensor_hash"),
        ("hash tensors (xxh3-128)", "snapshot.tensor_files", "tensor_hash"),
        ("count changes (numpy)", "snapshot.codec.tensor_codec:NumpyWords", "changed"),
        ("sparse: diff passes (numpy)", "snapshot.codec.tensor_codec:NumpyWords", "sparse_planes"),
        ("sparse: zstd frames", "snapshot.codec.sparse", "compress_chunk"),
        (
            "context: diff passes (numpy)",
            "snapshot.codec.tensor_codec:NumpyWords",
            "context_inputs",
        ),
        ("context: key histogram (numpy)", "snapshot.codec.context:ContextInputs", "key_counts"),
        ("context: model fit (numpy)", "snapshot.codec.context", "choose_model"),
        ("context: streams (C kernel)", "snapshot.codec.context_kernels", "encode_chunk"),
    ],
    "this checkout": [
        ("hash tensors (xxh3-128)", "snapshot.encoder", "tensor_hash"),
        ("hash tensors (xxh3-128)", "snapshot.tensor_files", "tensor_hash"),
        ("scan: changes and key histogram (C)", "snapshot.codec.changes", "scan_tensor"),
        ("sparse: planes (C) and zstd frames", "snapshot.codec.sparse", "compress_changes"),
        ("context: model fit", "snapshot.codec.context", "choose_model"),
        ("context: model fit", "snapshot.codec.context", "fit_changes"),
        ("context: streams (C kernel)", "snapshot.codec.context_kernels", "encode_chunk"),
        ("context: order-0 lengths (C)", "snapshot.codec.context_kernels", "stream_lengths"),
    ],
}


def snapshots(work: Path, steps: int, seed: int) -> list[Path]:
    """The bf16 snapshots of ``steps`` Adam steps at lr 1e-6 (made once, then reused)."""
    root = work / f"lr1e-6-seed{seed}"
    done = root / "done"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        training.fine_tune(root, lr=1e-6, steps=steps, seed=seed)
        done.write_text(str(steps))
    found = sorted(p for p in root.iterdir() if p.name.startswith("step-"))
    return found[: steps + 1]


def files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def timed_encode(
    encode: Callable[..., Any], previous: Path, current: Path, out: Path, threads: int
) -> tuple[Any, float, float]:
    """(result, CPU seconds, wall seconds) of one delta encode into ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    cpu, wall = time.process_time(), time.perf_counter()
    result = encode(
        previous, current, out, identity="cur", step=1, previous_identity="prev", threads=threads
    )
    return result, time.process_time() - cpu, time.perf_counter() - wall


@contextmanager
def stage_timers(package: str, stages: list[tuple[str, str, str]]) -> Iterator[dict[str, float]]:
    """CPU seconds per stage while inside (each listed attribute wrapped, then restored)."""
    spent: dict[str, float] = {}
    restore: list[tuple[Any, str, Any]] = []
    for label, where, name in stages:
        module_name, _, owner = where.partition(":")
        target: Any = importlib.import_module(f"{package}.{module_name}")
        if owner:
            target = getattr(target, owner)
        original = getattr(target, name)

        def wrapped(*args: Any, fn_: Any = original, label_: str = label, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn_(*args, **kwargs)
            finally:
                spent[label_] = spent.get(label_, 0.0) + time.process_time() - start

        restore.append((target, name, original))
        setattr(target, name, wrapped)
    try:
        yield spent
    finally:
        for target, name, original in reversed(restore):
            setattr(target, name, original)


def measure(
    pairs: list[tuple[Path, Path]], encoders: dict[str, ModuleType], work: Path, reps: int
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for previous, current in pairs:
        row: dict[str, Any] = {"pair": f"{previous.name}->{current.name}", "runs": {}}
        for threads in (1, 2):
            for _ in range(reps):
                written: dict[str, dict[str, bytes]] = {}
                for label, package in encoders.items():
                    out = work / f"out-{threads}-{len(written)}"
                    result, cpu, wall = timed_encode(
                        package.snapshot.encode, previous, current, out, threads
                    )
                    runs = row["runs"].setdefault(f"{label}/{threads}", {"cpu": [], "wall": []})
                    runs["cpu"].append(cpu)
                    runs["wall"].append(wall)
                    row["tensorBytes"] = result.tensor_bytes
                    row["storedBytes"] = result.stored_bytes
                    written[label] = files(out)
                first, *others = written.values()
                row["identical"] = row.get("identical", True) and all(o == first for o in others)
        for label, package in encoders.items():
            with stage_timers(package.__name__, STAGES[label]) as spent:
                _, cpu, _ = timed_encode(package.snapshot.encode, previous, current, work / "p", 1)
            row.setdefault("profile", {})[label] = {"total": cpu, **spent}
        rows.append(row)
        print(
            row["pair"], {k: round(statistics.median(v["cpu"]), 4) for k, v in row["runs"].items()}
        )
    return {"rows": rows}


def summarize(rows: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    full = rows[0]["tensorBytes"]  # the same model at every step
    out: dict[str, Any] = {"pairs": len(rows), "tensorBytes": full}
    out["identical"] = all(r["identical"] for r in rows)
    for label in labels:
        for threads in (1, 2):
            key = f"{label}/{threads}"
            cpu = [statistics.median(r["runs"][key]["cpu"]) for r in rows]
            wall = [statistics.median(r["runs"][key]["wall"]) for r in rows]
            out[key] = {
                "cpuSeconds": statistics.median(cpu),
                "mbpsPerCore": full / statistics.median(cpu) / MB,
                "mbpsPerCoreMin": full / max(cpu) / MB,
                "mbpsPerCoreMax": full / min(cpu) / MB,
                "mbpsWall": full / statistics.median(wall) / MB,
            }
        stages: dict[str, list[float]] = {}
        for r in rows:
            for stage, seconds in r["profile"][label].items():
                stages.setdefault(stage, []).append(seconds)
        out[f"{label}/profile"] = {k: statistics.median(v) for k, v in stages.items()}
    return out


def machine() -> dict[str, Any]:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import numpy
    import zstandard

    from hotload.snapshot.codec import context_kernels

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "zstandard": zstandard.__version__,
        "nativeKernels": context_kernels.NATIVE,
        "simd": context_kernels.SIMD,
        "loadAverage": os.getloadavg(),
    }


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    base, ours = results["labels"]
    lines = [
        "# Encoder speed: this checkout against the encoder before it, in one process",
        "",
        f"Command: `{results['command']}` (from the repository root; {results['seconds']:.0f} s).",
        f"Commit: `{results['commit']}`; baseline: `{results['baseline']}`.",
        f"Machine: {results['machine']['cpu']}, {results['machine']['cores']} cores; "
        f"{results['machine']['platform']}; Python {results['machine']['python']}, numpy "
        f"{results['machine']['numpy']}, zstandard {results['machine']['zstandard']}; native "
        f"kernels: {results['machine']['nativeKernels']}, AVX2: {results['machine']['simd']}. "
        f"Load average before/after: {results['machine']['loadAverage'][0]:.2f} / "
        f"{results['loadAfter']:.2f} (a shared machine: CPU seconds are what the encode "
        "itself spent; wall clock depends on the other work).",
        "Data: all-MiniLM-L6-v2 fine-tuned with Adam at lr 1e-6 (bench/codec/training.py, "
        f"seed {results['seed']}: held out, the encoder was tuned on seed 0's steps), "
        f"{s['pairs']} adjacent pairs of bf16 snapshots, {s['tensorBytes'] / MB:.1f} MB of "
        "tensors each. Every run: the whole delta `encode()` a publisher runs per snapshot "
        "(hash the previous tensors, per tensor diff, classify, entropy-code, hash; write "
        f"and hash the delta file and the manifest). {results['reps']} runs per pair, "
        "encoder and thread count, alternating between the encoders; medians over runs, "
        "then over pairs.",
        "",
        "| encoder | threads | CPU s / pair | MB/s per core (median; pairs' min-max) | MB/s wall |",
        "|---|---|---|---|---|",
    ]
    for label in (base, ours):
        for threads in (1, 2):
            v = s[f"{label}/{threads}"]
            lines.append(
                f"| {label} | {threads} | {v['cpuSeconds']:.3f} | **{v['mbpsPerCore']:.0f}** "
                f"({v['mbpsPerCoreMin']:.0f}-{v['mbpsPerCoreMax']:.0f}) | {v['mbpsWall']:.0f} |"
            )
    for threads in (1, 2):
        ratio = s[f"{ours}/{threads}"]["mbpsPerCore"] / s[f"{base}/{threads}"]["mbpsPerCore"]
        lines.append(f"\nPer core, {threads} thread(s): **{ratio:.2f}x** the baseline.")
    lines += [
        "",
        f"Every snapshot directory byte-identical between the two: **{s['identical']}**.",
        "",
        "## Where one encode's CPU goes (median over pairs, 1 thread, ms)",
        "",
        "| stage | " + " | ".join((base, ours)) + " |",
        "|---|---|---|",
    ]
    stages: list[str] = []
    for label in (base, ours):
        for stage in s[f"{label}/profile"]:
            if stage not in stages and stage != "total":
                stages.append(stage)
    for stage in [*stages, "other (Python between stages, small numpy calls, files, manifest)"]:
        cells = []
        for label in (base, ours):
            profile = s[f"{label}/profile"]
            if stage.startswith("other"):
                value = profile["total"] - sum(v for k, v in profile.items() if k != "total")
            else:
                value = profile.get(stage)
            cells.append("" if value is None else f"{value * 1e3:.1f}")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    totals = [s[f"{label}/profile"]["total"] * 1e3 for label in (base, ours)]
    lines.append("| **total** | " + " | ".join(f"**{t:.1f}**" for t in totals) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="d2baf31", help="commit of the encoder before")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="training seed (the encoder was tuned on seed 0's steps: 1 gives held-out ones)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/dev/shm/hotload-bench-encode"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    started = time.perf_counter()
    load = os.getloadavg()
    import subprocess

    import hotload

    labels = ["baseline", "this checkout"]
    encoders = {
        labels[0]: importlib.import_module(load_baseline(args.baseline).__name__),
        labels[1]: hotload,
    }
    for package in encoders.values():
        importlib.import_module(f"{package.__name__}.snapshot.encoder")
    args.work.mkdir(parents=True, exist_ok=True)
    found = snapshots(args.work, args.steps, args.seed)
    pairs = list(itertools.pairwise(found))
    measured = measure(pairs, encoders, args.work, args.reps)
    commit = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    results = {
        "command": "python " + " ".join(["bench/codec/encode.py", *sys.argv[1:]]),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "baseline": args.baseline,
        "labels": labels,
        "reps": args.reps,
        "seed": args.seed,
        "machine": {**machine(), "loadAverage": load},
        "rows": measured["rows"],
        "summary": summarize(measured["rows"], labels),
        "loadAfter": os.getloadavg()[0],
        "seconds": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "encode-results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "ENCODE-RESULTS.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
