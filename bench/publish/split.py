"""A sharded publish's encode per rank, without the ranks: one process encodes, in turn,
what each of N ranks would (FSDP2's ``Shard(0)`` split: each rank the same block of rows
of every tensor), for N = 1, 2, 4, 8.

    ~/.cache/hotload/venv/bin/python -m bench.publish.split [--reps 3]

bench/publish/run.py measures real ranks, but on a machine with fewer free cores than
ranks their CPU seconds include the contention of the ranks with each other. Here every
rank's share is encoded by one thread on its own, exactly as a rank's publisher encodes
it (:class:`~hotload.snapshot.parted.PartsWriter`, one codec thread, a delta against the
same block of the previous step), so the CPU seconds per rank are the encoder's work
alone: what falls as 1/N and what does not (per-tensor costs that every rank pays).
The model and its steps are run.py's (the reference engine's Qwen2 at ``--hidden`` /
``--layers``, real AdamW steps at ``--lr``), the weights in bf16. Repetitions alternate
between the rank counts; medians over repetitions and step pairs. The baseline in the
same process: the single-process publisher's whole encode of the same pairs
(:func:`hotload.snapshot.encode` of the gathered weights, one thread).
Writes ``split-results.json`` and ``SPLIT-RESULTS.md`` here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hotload, whatever is installed

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.publish.run import model_config, provenance  # noqa: E402
from hotload.engines.reference import model as rm  # noqa: E402
from hotload.engines.reference import tokenizer  # noqa: E402
from hotload.local.trainer import BATCH, CORPUS, WINDOW  # noqa: E402
from hotload.snapshot import encode  # noqa: E402
from hotload.snapshot.codec.tensor_codec import CodecOptions  # noqa: E402
from hotload.snapshot.parted import PartsWriter  # noqa: E402
from hotload.snapshot.state_dict import write_state_dict  # noqa: E402

MB = 1e6
Weights = dict[str, np.ndarray]


def train(config: Path, steps: int, lr: float) -> list[Weights]:
    """The bf16 words of every tensor after each of ``steps`` AdamW steps."""
    model = rm.build_model(rm.build_config(config), seed=0)
    model.train()
    model.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    tokens = torch.tensor(tokenizer.encode(CORPUS * 4), dtype=torch.long)
    generator = torch.Generator().manual_seed(1)
    names = list(rm.parameters(model))
    out = []
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - WINDOW, (BATCH,), generator=generator).tolist()
        batch = torch.stack([tokens[s : s + WINDOW] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state = model.state_dict()
        out.append(
            {
                name: state[name]
                .detach()
                .to(torch.bfloat16)
                .reshape(-1)
                .view(torch.int16)
                # bf16's bits as unsigned words, as a rank's block is
                .numpy()
                .view(np.uint16)
                .copy()
                for name in names
            }
        )
    return out


def rows(shape: tuple[int, ...], ranks: int, rank: int) -> tuple[int, int]:
    """Elements [start, stop) of ``rank``'s Shard(0) block (torch.chunk's split of rows)."""
    count = shape[0] if shape else 1
    row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    step = -(-count // ranks)
    first, last = min(rank * step, count), min((rank + 1) * step, count)
    return first * row, last * row


def encode_rank(
    before: Weights, after: Weights, shapes: dict[str, tuple[int, ...]], ranks: int, rank: int
) -> tuple[float, int, int]:
    """One rank's delta, as its publisher encodes it: (CPU s, bytes in, bytes stored)."""
    out = Path(tempfile.mkdtemp(prefix="split-"))
    try:
        cpu = time.thread_time()
        writer = PartsWriter(out, "part.bin", options=CodecOptions(), executor=None)
        held = 0
        for name, words in after.items():
            start, stop = rows(shapes[name], ranks, rank)
            if stop > start:
                writer.add(
                    "BF16", start, words[start:stop], before[name][start:stop], complete=False
                )
                held += (stop - start) * 2
        stored = writer.close()
        return time.thread_time() - cpu, held, stored.size if stored else 0
    finally:
        shutil.rmtree(out, ignore_errors=True)


def encode_single(before: Path, after: Path) -> float:
    """The single-process publisher's whole delta of the gathered weights (CPU s)."""
    out = Path(tempfile.mkdtemp(prefix="split-single-"))
    try:
        cpu = time.process_time()
        encode(
            before, after, out / "delta", identity="b-step-2", step=2, previous_identity="b-step-1"
        )
        return time.process_time() - cpu
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", default="1,2,4,8")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    command = "python -m bench.publish.split " + " ".join(sys.argv[1:])
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-split-"))
    try:
        config = model_config(work / "model", args.hidden, args.layers)
        states = train(config, args.steps, args.lr)
        model = rm.build_model(rm.build_config(config))
        shapes = {n: tuple(int(d) for d in p.shape) for n, p in rm.parameters(model).items()}
        del model
        dirs = []
        for index, state in enumerate(states):
            directory = work / f"step-{index}"
            directory.mkdir()
            tensors = {
                n: torch.from_numpy(w.view(np.int16)).view(torch.bfloat16).reshape(shapes[n])
                for n, w in state.items()
            }
            write_state_dict(tensors, directory)
            shutil.copy(config, directory / "config.json")
            dirs.append(directory)
        counts = [int(n) for n in args.ranks.split(",")]
        per: dict[int, list[tuple[float, int, int]]] = {n: [] for n in counts}
        single: list[float] = []
        for _ in range(args.reps):
            for pair in range(len(states) - 1):
                before, after = states[pair], states[pair + 1]
                single.append(encode_single(dirs[pair], dirs[pair + 1]))
                for n in counts:
                    per[n].extend(encode_rank(before, after, shapes, n, r) for r in range(n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows_out = []
    for n in counts:
        cpus = [c for c, _, _ in per[n]]
        held = statistics.median(h for _, h, _ in per[n])
        rows_out.append(
            {
                "ranks": n,
                "rank_cpu_s_median": statistics.median(cpus),
                "rank_cpu_s_max": max(cpus),
                "rank_bytes": held,
                "rank_stored_bytes": statistics.median(s for _, _, s in per[n]),
                "total_stored_bytes": statistics.median(s for _, _, s in per[n]) * n,
                "mb_s_per_core": held / MB / statistics.median(cpus),
            }
        )
    one = rows_out[0]["rank_cpu_s_median"]
    for row in rows_out:
        row["vs_one_rank"] = row["rank_cpu_s_median"] / one
        row["ideal"] = 1 / row["ranks"]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    results: dict[str, Any] = {
        "command": command,
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.monotonic() - began),
        "model_params": sum(int(np.prod(s)) for s in shapes.values()),
        "tensors": len(shapes),
        "pairs": args.steps - 1,
        "reps": args.reps,
        "lr": args.lr,
        "single_process_cpu_s_median": statistics.median(single),
        "rows": rows_out,
    }
    (HERE / "split-results.json").write_text(json.dumps(results, indent=2) + "\n")
    (HERE / "SPLIT-RESULTS.md").write_text(markdown(results))
    print(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# bench/publish/split: a sharded delta's encode per rank, in one process",
        "",
        provenance(results) + f"; model {results['model_params'] / 1e6:.1f}M "
        f"parameters in {results['tensors']} tensors (bf16), {results['pairs']} pairs of "
        f"adjacent AdamW steps at lr {results['lr']}, {results['reps']} repetitions "
        "alternating between the rank counts; one codec thread.",
        "",
        "Each rank's share (the same block of rows of every tensor, FSDP2's split) encoded "
        "by one thread exactly as its publisher encodes it; *CPU s* is that thread's CPU "
        "time (median over ranks, pairs and repetitions; max beside). Baseline, same "
        "process: the single-process publisher's whole delta encode of the gathered "
        f"weights, {results['single_process_cpu_s_median']:.3f} CPU s (median).",
        "",
        "| ranks | MB per rank | CPU s per rank (max) | vs one rank | ideal | MB/s per core "
        "| stored KB per rank | stored KB, all ranks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['ranks']} | {row['rank_bytes'] / MB:.1f} "
            f"| {row['rank_cpu_s_median']:.3f} ({row['rank_cpu_s_max']:.3f}) "
            f"| {row['vs_one_rank']:.2f}x | {row['ideal']:.2f}x "
            f"| {row['mb_s_per_core']:.0f} | {row['rank_stored_bytes'] / 1e3:.1f} "
            f"| {row['total_stored_bytes'] / 1e3:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
