"""From this machine's measured rates to our users' sizes: publish → every region Ready.

Nothing here runs a cluster. It reads the rates the other benchmarks measured (their
results files, named in the assumption table beside each number), states every number
it could not measure here (links, cores, replica counts, engine load rates), and adds the
stages of one snapshot's way from the trainer to the last replica of the last region, for
a 7B, a 70B and a 1T bf16 policy:

    encode (trainer) → upload (home bucket) → replicate (WAN, every region at once)
    → fetch (each replica, from its region's bucket) → verify + rebuild (the sidecar)
    → engine load → report (one pod write per replica; the operator counts it)

for deltas (what hotload ships) and for a Full every step (a system without deltas),
beside other systems' published figures (engine-facts.md, DESIGN.md). The stages are
summed, not overlapped: a snapshot's stages run one after the other (a replica can only
rebuild what it fetched), and the next snapshot's pipeline overlaps this one's, so the
sum is the latency and the slowest stage bounds the cadence.

    python bench/projection/run.py [--out bench/projection]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
MB = 1e6


@dataclass(frozen=True)
class Rate:
    """A number the projection uses, and where it comes from."""

    value: float
    unit: str
    source: str
    measured: bool


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def measured_rates() -> dict[str, Rate]:
    """The rates this machine's benchmarks measured (their files), with fallbacks named."""
    codec = _json(REPO / "bench/codec/results.json").get("runs", {}).get("1e-6", {})
    adjacent = (codec.get("adjacent") or {}).get("summary") or {}
    gap = (codec.get("gap") or {}).get("summary") or {}
    encode = _json(REPO / "bench/codec/encode-results.json")
    encode_per_core = _encode_per_core(encode)
    propagation = _json(REPO / "bench/propagation/results.json")
    writes, apiserver_ms = _propagation_costs(propagation)
    rates = {
        "ratio": Rate(
            adjacent.get("ratio", 410.4),
            "x",
            "bench/codec/results.json: lr 1e-6 adjacent "
            "steps of a real fine-tune, median ratio (every stored byte counted)",
            True,
        ),
        "ratio_gap": Rate(
            gap.get("ratio", 43.9),
            "x",
            "bench/codec/RESULTS.md: 25 steps apart (7% of "
            "elements changed: what a publisher that skipped many steps ships)",
            True,
        ),
        "encode_core": Rate(
            encode_per_core,
            "MB/s per core",
            "bench/codec/ENCODE-RESULTS.md: the whole "
            "delta encode a publisher runs, 1 thread, on this (busy) machine",
            True,
        ),
        "trainer_host": Rate(
            100.0,
            "MB/s per host",
            "bench/codec/GPU-RESULTS.md: encode from CUDA tensors "
            "on an H200 host (16 threads; host-bound, 4.2% changed: a pessimistic step)",
            True,
        ),
        "rebuild_core": Rate(
            adjacent.get("rebuildInPlaceCpuMBps", 1332.0),
            "MB/s per core",
            "bench/codec/results.json: rebuild in place (the sidecar's free buffer), "
            "verification included, MB of rebuilt weights per CPU second",
            True,
        ),
        "patch_core": Rate(
            adjacent.get("patchInPlaceCpuMBps", 2041.0),
            "MB/s per core",
            "bench/codec/results.json: patching held arrays (an engine that patches in "
            "place), verification included",
            True,
        ),
        "pod_writes": Rate(
            writes,
            "writes per replica per snapshot",
            "bench/propagation/results.json: pod PATCHes (pods and pods/status) per "
            "replica per delta at the largest size run (median over the deltas)",
            bool(propagation),
        ),
        "apiserver_ms": Rate(
            apiserver_ms,
            "CPU ms per replica per snapshot",
            "bench/propagation/results.json: the region's API server + etcd CPU per "
            "replica per delta (2 shared cores, so an upper bound)",
            bool(propagation),
        ),
    }
    return rates


def _encode_per_core(encode: dict[str, Any]) -> float:
    """This checkout's 1-thread MB/s per core from encode-results.json (369 when absent)."""
    summary = encode.get("summary") or {}
    return float((summary.get("this checkout/1") or {}).get("mbpsPerCore", 369.0))


def _propagation_costs(document: dict[str, Any]) -> tuple[float, float]:
    sizes = document.get("sizes") or []
    if not sizes:
        return 1.0, 25.0
    largest = max(sizes, key=lambda s: s["replicas"])
    cost = largest.get("median_cost_per_snapshot") or {}
    replicas = largest["replicas"]
    # The replicas' own pod writes (pods and pods/status PATCHes); older results files
    # counted every client's PATCHes only.
    writes = cost.get("apiserver_pod_patches", cost.get("apiserver_patches_all_clients", 0))
    writes = (writes or replicas) / replicas
    cpu = largest.get("median_cpu_seconds_per_snapshot_by_component") or {}
    server = cpu.get("kube-apiserver", 0.0) + cpu.get("etcd", 0.0)
    return round(writes, 2), round(server / replicas * 1000, 1)


#: What could not be measured here: stated, each with why.
STATED = {
    "wan": Rate(1.25, "GB/s", "10 Gbit/s between regions (the issue's example link)", False),
    "upload": Rate(12.5, "GB/s", "trainer hosts to the home bucket, 100 Gbit/s together", False),
    "region_store": Rate(
        12.5, "GB/s", "a region's object store serving its replicas, 100 Gbit/s together", False
    ),
    "replica_nic": Rate(3.1, "GB/s", "25 Gbit/s front-end network per replica", False),
    "engine_load_gpu": Rate(
        5.0,
        "GB/s per GPU",
        "a reload from the staging tmpfs into GPU memory (vLLM/SGLang "
        "reload a whole directory; unpinned host-to-device copies, one per GPU)",
        False,
    ),
    "apiserver_cores": Rate(
        8.0, "cores", "a production API server + etcd's cores for pod writes", False
    ),
    "regions": Rate(3.0, "regions", "as bench/freshness and bench/propagation", False),
}


#: Other systems' published figures (cited in /work/shared, from their public sources).
PUBLISHED = {
    "sparse_ratio": Rate(
        79.0,
        "x",
        "DESIGN.md: published sparse lossless encodings of adjacent RL steps, average",
        False,
    ),
    "restart_mid_s": Rate(
        100.0,
        "s (upper end of 30-100+)",
        "engine-facts.md: a full engine reload/restart of a mid-size model, published",
        False,
    ),
    "restart_235b_s": Rate(
        390.0,
        "s (5-6.5 min)",
        "engine-facts.md: a 235B FP8 engine restart, published",
        False,
    ),
}


@dataclass(frozen=True)
class Policy:
    name: str
    params: float
    gpus_per_replica: int
    replicas_per_region: int
    trainer_hosts: int
    cores_per_trainer_host: int
    sidecar_cores: int

    @property
    def bytes(self) -> float:
        return self.params * 2  # bf16


POLICIES = (
    Policy("7B", 7e9, 1, 1000, 1, 32, 8),
    Policy("70B", 70e9, 8, 250, 8, 32, 32),
    Policy("1T", 1e12, 32, 32, 64, 32, 64),
)


def stages(
    policy: Policy, rates: dict[str, Rate], *, delta: bool, ratio: float
) -> dict[str, float]:
    """Seconds per stage for one snapshot of ``policy``."""
    r = {**rates, **STATED}
    full = policy.bytes
    sent = full / ratio if delta else full
    cores = policy.trainer_hosts * policy.cores_per_trainer_host
    replicas = policy.replicas_per_region
    fetch_rate = min(r["replica_nic"].value * GB, r["region_store"].value * GB / replicas)
    rebuild = full / (r["rebuild_core"].value * MB * policy.sidecar_cores) if delta else 0.0
    # Every replica's report through one region's API server (its CPU per replica).
    report = replicas * r["apiserver_ms"].value / 1000 / r["apiserver_cores"].value
    return {
        "encode": full / (r["encode_core"].value * MB * cores) if delta else 0.0,
        "upload": sent / (r["upload"].value * GB),
        "replicate": sent / (r["wan"].value * GB),
        "fetch": sent / fetch_rate,
        "rebuild": rebuild,
        "engine_load": full / (r["engine_load_gpu"].value * GB * policy.gpus_per_replica),
        "report": report,
    }


def project() -> dict[str, Any]:
    rates = measured_rates()
    rows = []
    for policy in POLICIES:
        for mode, delta, ratio in (
            ("delta (adjacent steps)", True, rates["ratio"].value),
            ("delta (25 steps apart)", True, rates["ratio_gap"].value),
            ("delta at the published 79x", True, PUBLISHED["sparse_ratio"].value),
            ("full every step", False, 1.0),
        ):
            seconds = stages(policy, rates, delta=delta, ratio=ratio)
            host_bound = (
                policy.bytes / (rates["trainer_host"].value * MB * policy.trainer_hosts)
                if delta
                else 0.0
            )
            rows.append(
                {
                    "policy": policy.name,
                    "mode": mode,
                    "bytes_sent": policy.bytes / ratio,
                    "stages_s": {k: round(v, 2) for k, v in seconds.items()},
                    "total_s": round(sum(seconds.values()), 1),
                    "slowest": max(seconds, key=lambda k: seconds[k]),
                    "encode_today_host_bound_s": round(host_bound, 1),
                    "total_with_today_encode_s": round(
                        sum(seconds.values()) - seconds["encode"] + host_bound, 1
                    ),
                }
            )
    return {
        "rates": {k: asdict(v) for k, v in rates.items()},
        "stated": {k: asdict(v) for k, v in STATED.items()},
        "published": {k: asdict(v) for k, v in PUBLISHED.items()},
        "policies": [asdict(p) for p in POLICIES],
        "rows": rows,
    }


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"


def render(document: dict[str, Any], command: str) -> str:
    lines = [
        "# Projection: publish → every region Ready, at our users' sizes",
        "",
        f"Command: `{command}`  ",
        f"When: {document['when']}. Computed, not run: measured rates of this machine's "
        "benchmarks (their files named below) and stated ones for what cannot be measured "
        "here. The stages of one snapshot are added (see `run.py`'s docstring).",
        "",
        "## Every number it uses",
        "",
        "| name | value | unit | measured here? | source |",
        "|---|---|---|---|---|",
    ]
    every = {**document["rates"], **document["stated"], **document.get("published", {})}
    for name, rate in every.items():
        where = "yes" if rate["measured"] else "stated"
        where = "published" if name in document.get("published", {}) else where
        lines.append(
            f"| {name} | {rate['value']:,.2f} | {rate['unit']} | {where} | {rate['source']} |"
        )
    lines += [
        "",
        "| policy | parameters | bf16 bytes | GPUs per replica | replicas per region "
        "| trainer hosts x cores (encode) | sidecar cores per replica |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in document["policies"]:
        lines.append(
            f"| {p['name']} | {p['params']:.0e} | {p['params'] * 2 / GB:,.0f} GB "
            f"| {p['gpus_per_replica']} | {p['replicas_per_region']:,} "
            f"| {p['trainer_hosts']} x {p['cores_per_trainer_host']} | {p['sidecar_cores']} |"
        )
    names = list(document["rows"][0]["stages_s"])
    lines += [
        "",
        "## Seconds per stage, and publish → every region Ready",
        "",
        "| policy | what is shipped | bytes per region | "
        + " | ".join(names)
        + " | total | slowest stage | total with today's trainer-side encode |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for row in document["rows"]:
        cells = " | ".join(_seconds(row["stages_s"][n]) for n in names)
        today = (
            _seconds(row["total_with_today_encode_s"]) if row["mode"] != "full every step" else "-"
        )
        lines.append(
            f"| {row['policy']} | {row['mode']} | {row['bytes_sent'] / GB:,.2f} GB | {cells} "
            f"| **{_seconds(row['total_s'])}** | {row['slowest']} | {today} |"
        )
    lines += ["", document["analysis"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "projection")
    args = parser.parse_args()
    document = project()
    document["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    analysis = Path(__file__).with_name("analysis.md")
    document["analysis"] = analysis.read_text().rstrip() if analysis.exists() else ""
    command = " ".join(["python bench/projection/run.py", *sys.argv[1:]])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out / "results.md").write_text(render(document, command))
    for row in document["rows"]:
        total = row["total_s"]
        print(f"{row['policy']:>4} {row['mode']:<24} {_seconds(total):>9}  ({row['slowest']})")
    assert all(math.isfinite(r["total_s"]) for r in document["rows"])


if __name__ == "__main__":
    main()
