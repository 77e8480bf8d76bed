"""The codec's torch path on CUDA against the same path on the CPU, in one process.

    python bench/codec/cuda_path.py --out DIR [--params 500e6] [--repeats 3]

What a trainer on a GPU does at every step: encode the delta between the step's bf16
weights and the previous step's, both held as tensors (``encode_state_dict(previous=
state_dict)``), and what a GPU replica does with it: patch the delta into its live
weights (``patch_state_dict``). Each is timed with the tensors on the CPU and on CUDA
(when present), medians over ``--repeats``; the CUDA snapshot must be byte-identical to
the CPU one and every patch bit-exact, or the run fails.

The weights are a synthetic model (transformer-shaped bf16 matrices, N(0, 0.02)) moved
by an Adam-like update at lr 1e-6 on an fp32 master (each element moves ±lr, so a bf16
element changes when its master crosses a rounding boundary, as in RL training): the
changed fraction is printed beside the figures. ``hack/gpu-check`` runs this on a lent
GPU machine; without CUDA it measures the CPU alone (a dry run of the script).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's hotload, whatever is installed

import torch  # noqa: E402

from hotload.snapshot import encode_state_dict, rebuild  # noqa: E402
from hotload.snapshot.codec.torch_words import words_of  # noqa: E402
from hotload.snapshot.torch_codec import patch_state_dict  # noqa: E402

MB = 1e6
LR = 1e-6
HIDDEN = 2048


def shapes(params: float) -> list[tuple[str, tuple[int, ...]]]:
    """Layers of a decoder-only transformer of about ``params`` parameters (hidden 2048,
    MLP 4x), plus norms: many mid-sized matrices, as a real state_dict has."""
    per_layer = 12 * HIDDEN * HIDDEN
    layers = max(1, round(params / per_layer))
    out: list[tuple[str, tuple[int, ...]]] = []
    for i in range(layers):
        prefix = f"model.layers.{i}"
        out += [
            (f"{prefix}.self_attn.qkv_proj.weight", (3 * HIDDEN, HIDDEN)),
            (f"{prefix}.self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (f"{prefix}.mlp.up_proj.weight", (4 * HIDDEN, HIDDEN)),
            (f"{prefix}.mlp.down_proj.weight", (HIDDEN, 4 * HIDDEN)),
            (f"{prefix}.input_layernorm.weight", (HIDDEN,)),
        ]
    return out


def training_pair(params: float, seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two adjacent steps' bf16 weights (on the CPU), after a few warm-up steps so the
    fp32 master sits off the bf16 grid as a trained model's does."""
    generator = torch.Generator().manual_seed(seed)
    previous: dict[str, Any] = {}
    current: dict[str, Any] = {}
    for name, shape in shapes(params):
        master = torch.randn(shape, generator=generator) * 0.02
        for _ in range(3):
            master -= LR * torch.randn(shape, generator=generator).sign()
        previous[name] = master.to(torch.bfloat16)
        master -= LR * torch.randn(shape, generator=generator).sign()
        current[name] = master.to(torch.bfloat16)
    return previous, current


def on(device: str, tensors: dict[str, Any]) -> dict[str, Any]:
    return {name: t.to(device) for name, t in tensors.items()}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def encode_times(
    previous: dict[str, Any],
    current: dict[str, Any],
    device: str,
    work: Path,
    *,
    threads: int,
    repeats: int,
) -> tuple[list[float], dict[str, bytes]]:
    prev_on, cur_on = on(device, previous), on(device, current)
    sync(device)
    times: list[float] = []
    files: dict[str, bytes] = {}
    for i in range(repeats):
        out = work / f"delta-{device}-{threads}-{i}"
        started = time.perf_counter()
        encode_state_dict(
            cur_on,
            out,
            identity="s1",
            step=1,
            previous=prev_on,
            previous_identity="s0",
            threads=threads,
        )
        sync(device)
        times.append(time.perf_counter() - started)
        files = files_of(out)
        shutil.rmtree(out)
    return times, files


def patch_times(
    previous: dict[str, Any],
    current: dict[str, Any],
    delta: Path,
    device: str,
    *,
    repeats: int,
) -> list[float]:
    times: list[float] = []
    for _ in range(repeats):
        held = {name: t.to(device, copy=True) for name, t in previous.items()}
        sync(device)
        started = time.perf_counter()
        patch_state_dict(held, delta, held_identity="s0")
        sync(device)
        times.append(time.perf_counter() - started)
        for name, tensor in current.items():
            if not torch.equal(words_of(held[name]).cpu(), words_of(tensor)):
                raise SystemExit(f"patch on {device} is not bit-exact at {name}")
        del held
    return times


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        from hotload.snapshot.codec.context_kernels import NATIVE, SIMD

        info["native_codec"] = bool(NATIVE)
        info["simd"] = bool(SIMD)
    except ImportError:  # an older tree without the flags
        pass
    return info


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The codec's torch path: CUDA against the CPU",
        "",
        f"Command: `{results['command']}`  ",
        f"Date: {results['date']}  ",
        f"Machine: {json.dumps(results['machine'])}",
        "",
        f"Model: {results['params'] / 1e6:.0f}M bf16 parameters "
        f"({results['weight_mb']:.0f} MB), lr {LR:g} Adam-like step, "
        f"{100 * results['changed_fraction']:.2f}% of elements changed; delta "
        f"{results['delta_bytes'] / 1e6:.2f} MB (ratio {results['ratio']:.0f}x).",
        "",
        "| work | device | threads | median s | MB/s of weights | runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['work']} | {row['device']} | {row['threads']} | {row['median_s']:.3f} | "
            f"{row['mb_per_s']:.0f} | {', '.join(f'{t:.3f}' for t in row['times'])} |"
        )
    lines += ["", "Checks: " + "; ".join(results["checks"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    params = args.params or (500e6 if cuda else 20e6)
    cpus = os.cpu_count() or 1
    args.out.mkdir(parents=True, exist_ok=True)
    previous, current = training_pair(params)
    total = sum(t.numel() for t in current.values())
    changed = sum(int((words_of(previous[n]) != words_of(current[n])).sum()) for n in current)
    weight_mb = 2 * total / MB
    rows: list[dict[str, Any]] = []
    checks: list[str] = []

    def row(work: str, device: str, threads: int, times: list[float]) -> None:
        median = statistics.median(times)
        rows.append(
            {
                "work": work,
                "device": device,
                "threads": threads,
                "times": times,
                "median_s": median,
                "mb_per_s": weight_mb / median,
            }
        )
        print(
            f"{work:6s} {device:4s} threads={threads:2d} median {median:.3f} s "
            f"({weight_mb / median:.0f} MB/s)",
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="cuda-path-") as tmp:
        work = Path(tmp)
        reference: dict[str, bytes] | None = None
        for threads in sorted({1, cpus}):
            times, files = encode_times(
                previous, current, "cpu", work, threads=threads, repeats=args.repeats
            )
            row("encode", "cpu", threads, times)
            reference = reference or files
        assert reference is not None
        if cuda:
            times, files = encode_times(
                previous, current, "cuda", work, threads=cpus, repeats=args.repeats
            )
            row("encode", "cuda", cpus, times)
            if files != reference:
                raise SystemExit("the snapshot encoded from CUDA tensors differs from the CPU's")
            checks.append("CUDA-encoded snapshot byte-identical to the CPU's")
        # a replica's path: the delta against the rebuilt s0 it holds
        full = work / "s0"
        encode_state_dict(previous, full, identity="s0", step=0)
        rebuild(None, full, work / "r0")
        encode_state_dict(
            current,
            work / "s1",
            identity="s1",
            step=1,
            previous=work / "r0",
            previous_identity="s0",
        )
        delta_bytes = sum(p.stat().st_size for p in (work / "s1").iterdir() if p.is_file())
        row(
            "patch",
            "cpu",
            1,
            patch_times(previous, current, work / "s1", "cpu", repeats=args.repeats),
        )
        checks.append("every CPU patch bit-exact")
        if cuda:
            row(
                "patch",
                "cuda",
                1,
                patch_times(previous, current, work / "s1", "cuda", repeats=args.repeats),
            )
            checks.append("every CUDA patch bit-exact")
    results = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "params": total,
        "weight_mb": weight_mb,
        "changed_fraction": changed / total,
        "delta_bytes": delta_bytes,
        "ratio": 2 * total / delta_bytes,
        "rows": rows,
        "checks": checks,
    }
    (args.out / "cuda-path.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "cuda-path.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
