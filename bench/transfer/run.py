"""Bytes over the WAN per snapshot, and time, as the replicas per region grow.

Everything is real: three local regions (etcd, kube-apiserver, kwok, the pod runtime), each
with its own bucket (MinIO) behind an emulated WAN link (toxiproxy: a rate and a latency,
counting every byte), buckets replicated by MinIO, the chart installed with helm (the
operator), and per region a RolloutDeployment of ``noop``-engine replicas (the runtime's
shared mode: real sidecars that fetch and verify every file, an engine that accepts at
once). A trainer takes real AdamW steps of the reference model; the publisher writes the
home bucket and applies the PolicySnapshot everywhere, waiting until every replica in every
region is Ready.

Two designs, each at 3, 30 and 300 replicas per region:

- ``regional``: hotload's. Each region's replicas read their own region's bucket; the
  snapshot crosses each region's link once (the trainer's upload into the home region,
  MinIO's replication into the others).
- ``naive``: the baseline, every replica pulls from the trainer's bucket across the WAN
  (its RolloutDeployment names the home bucket at the home region's WAN endpoint).

Per delta: bytes over every link (toxiproxy's counters), the snapshot's stored bytes, the
ratio bytes/(stored x regions), publish -> every replica Ready per region, and the link's
floor (stored bytes / rate + one-way latency) for comparison. A replica count run for
``regional`` only (``--designs regional`` for the largest) gets a ``naive`` row projected
from the naive runs measured (a line in the replicas per region), marked as such.

    ~/.cache/hotload/venv/bin/python -m bench.transfer.run [--replicas 3,30,300] [--deltas 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from bench.load import LoadSampler
from hotload.local import down, object_storage, wan
from hotload.local.bootstrap import api_client
from hotload.local.chart import ChartRelease
from hotload.local.fleets import FleetSpec, apply_fleet, regional_deployment
from hotload.local.lifecycle import LocalRegions
from hotload.local.reaper import start_reaper
from hotload.local.region import RegionAddons, WanLink
from hotload.local.trainer import PolicyTrainer
from hotload.local.world import bring_up
from hotload.publish import PUBLISH_ENDPOINT_ANNOTATION, Publisher, PublisherSettings

HERE = Path(__file__).resolve().parent
REGIONS = ("us-east", "eu-west", "ap-south")
#: The operator watches the bench's ``hl-*`` namespaces (a glob: the chart's cluster-wide mode).
BENCH_CHART = ChartRelease(watch_namespaces=("hl-*",), cluster_wide=True)
NAIVE_BUCKET = "naive"


def _namespace(regions: LocalRegions, name: str) -> None:
    for region in regions.regions:
        api = api_client(region)
        try:
            k8s.CoreV1Api(api).create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
        finally:
            api.close()  # type: ignore[no-untyped-call]


def _naive_deployment(regions: LocalRegions, spec: FleetSpec) -> None:
    """Every region's replicas read the home bucket, across the home region's WAN link."""
    home = regions.regions[0]
    client = object_storage.s3_client(home)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if NAIVE_BUCKET not in existing:
        client.create_bucket(Bucket=NAIVE_BUCKET)
    for region in regions.regions:
        apply_fleet(region, spec)  # the Secret (home credentials are patched below)
        body = regional_deployment(region, spec)
        body["spec"]["hotLoad"]["bucketUrl"] = f"s3://{NAIVE_BUCKET}/snapshots"
        body["spec"]["hotLoad"]["endpoint"] = wan.endpoint(home)
        body["metadata"]["annotations"][PUBLISH_ENDPOINT_ANNOTATION] = wan.endpoint(home)
        creds = object_storage.credentials(home)
        api = api_client(region)
        try:
            k8s.CoreV1Api(api).patch_namespaced_secret(
                f"{spec.name}-bucket", spec.namespace,
                {"stringData": {"AWS_ACCESS_KEY_ID": creds.access_key_id,
                                "AWS_SECRET_ACCESS_KEY": creds.secret_access_key}},
            )  # fmt: skip
            k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
                "hotload.dev", "v1alpha1", spec.namespace, "rolloutdeployments", spec.name,
                body, field_manager="hotload-local", force=True,
                _content_type="application/apply-patch+yaml",
            )  # fmt: skip
        finally:
            api.close()  # type: ignore[no-untyped-call]


def _links(regions: LocalRegions) -> dict[str, wan.WanBytes]:
    return {region.name: wan.bytes_over(region) for region in regions.regions}


def run_design(
    regions: LocalRegions,
    trainer: PolicyTrainer,
    files: Path,
    work: Path,
    *,
    design: str,
    replicas: int,
    deltas: int,
    rate_kb_s: int,
    latency_ms: int,
    say: Any,
) -> dict[str, Any]:
    namespace = f"hl-transfer-{design}-{replicas}-{secrets.token_hex(2)}"
    _namespace(regions, namespace)
    spec = FleetSpec(name="policy", namespace=namespace, replicas=replicas, engine="noop")
    if design == "naive":
        _naive_deployment(regions, spec)
    else:
        for region in regions.regions:
            apply_fleet(region, spec)
    settings = PublisherSettings(
        deployment=spec.name,
        contexts=tuple(regions.names),
        workdir=work / namespace,
        namespace=namespace,
        kubeconfig=regions.kubeconfig,
        identity_prefix=f"t{replicas}",
        home=regions.names[0],
        wait=True,
        wait_timeout_s=1800,
        files_from=files,
    )
    rows = []
    with Publisher(settings) as publisher:
        # The first Full only starts the replicas (not measured): it crosses unlimited links,
        # else the naive design's hundreds of full pulls would take most of an hour.
        for region in regions.regions:
            wan.set_link(region, 0, latency_ms)
        say(f"[{design} x{replicas}] Full (replicas starting; links unlimited)")
        publisher.publish(trainer.inference_state(), trainer.step, full=True).result()
        for region in regions.regions:
            wan.set_link(region, rate_kb_s, latency_ms)
        for _ in range(deltas):
            trainer.train_step()
            before = _links(regions)
            result = publisher.publish(trainer.inference_state(), trainer.step).result()
            after = _links(regions)
            links = {
                name: {
                    "inbound": after[name].inbound - before[name].inbound,
                    "outbound": after[name].outbound - before[name].outbound,
                }
                for name in regions.names
            }
            # Bytes that crossed a link in either direction: uploads and replication come
            # in, naive pulls go out of the home region.
            crossed = sum(v["inbound"] + v["outbound"] for v in links.values())
            busiest = max(v["inbound"] + v["outbound"] for v in links.values())
            ready = {c: r.ready_seconds for c, r in result.regions.items()}
            rows.append(
                {
                    "snapshot": result.identity,
                    "stored_bytes": result.stored_bytes,
                    "wan_bytes": crossed,
                    "wan_per_region_copy": round(crossed / (result.stored_bytes * len(links)), 2),
                    "links": links,
                    "ready_seconds": ready,
                    "outcomes": {c: r.outcome.value for c, r in result.regions.items()},
                    # What the busiest link alone needs: its bytes at its rate, plus latency.
                    "floor_seconds": round(busiest / (rate_kb_s * 1000) + latency_ms / 1000, 3)
                    if rate_kb_s
                    else None,
                    "busiest_link_bytes": busiest,
                }
            )
            slowest = max(v or 0 for v in ready.values())
            say(
                f"[{design} x{replicas}] {result.identity}: {result.stored_bytes:,} B stored, "
                f"{crossed:,} B over the WAN, Ready in {slowest:.1f} s"
            )
    _teardown(regions, namespace, say)
    return {"design": design, "replicas_per_region": replicas, "deltas": rows}


def _teardown(regions: LocalRegions, namespace: str, say: Any, timeout_s: float = 600) -> None:
    """Delete the run's namespace everywhere and wait until its pods are gone (the next run
    needs the nodes' room)."""
    for region in regions.regions:
        api = api_client(region)
        try:
            k8s.CoreV1Api(api).delete_namespace(namespace)
        finally:
            api.close()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + timeout_s
    for region in regions.regions:
        api = api_client(region)
        try:
            while k8s.CoreV1Api(api).list_namespaced_pod(namespace).items:
                if time.monotonic() > deadline:
                    say(f"  {region.name}: pods of {namespace} still there after {timeout_s:.0f} s")
                    break
                time.sleep(2)
        finally:
            api.close()  # type: ignore[no-untyped-call]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="3,30,300", help="replicas per region, comma list")
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--size", default="small")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--wan-rate", type=int, default=2_000, help="KB/s each way")
    parser.add_argument("--wan-latency", type=int, default=25, help="ms one way")
    parser.add_argument("--designs", default="regional,naive")
    parser.add_argument(
        "--naive-up-to",
        type=int,
        default=None,
        help="run the naive design only up to this many replicas per region (larger counts "
        "get a projected naive row: hundreds of per-replica pulls take long on a small machine)",
    )
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--note", default="", help="a line for results.md (e.g. what did not run)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the results from --out's results.json (with --replicas and --note)",
    )
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((args.out / "results.json").read_text())
        saved.pop("projected", None)
        runs = saved.pop("runs")
        saved.setdefault("wan_rate_kb_s", args.wan_rate)
        saved.setdefault("wan_latency_ms", args.wan_latency)
        saved["replicas_requested"] = [int(n) for n in args.replicas.split(",")]
        saved["note"] = args.note or saved.get("note", "")
        report(saved, runs, args.out)
        return
    command = " ".join(["python -m bench.transfer.run", *sys.argv[1:]])
    counts = [int(n) for n in args.replicas.split(",")]
    say = print
    state = Path(tempfile.mkdtemp(prefix="hotload-bench-transfer-"))
    addons = RegionAddons(
        object_storage=True,
        wan=WanLink(rate_kb_s=args.wan_rate, latency_ms=args.wan_latency),
        replication=True,
    )
    gpus = max(counts) // 2 + 8
    say(f"bringing up {len(REGIONS)} regions ({gpus} GPUs per node x 2) in {state}")
    # Should this process be killed, the reaper takes the regions down after it.
    reaper = start_reaper(state)
    regions = bring_up(
        REGIONS,
        addons=addons,
        state_dir=state,
        index_base=231,
        gpus_per_node=gpus,
        chart=BENCH_CHART,
    )
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(regions.aws_credentials_file)
    os.environ["AWS_CONFIG_FILE"] = str(regions.aws_config_file)
    try:
        trainer = PolicyTrainer(state / "trainer", name="bench", size=args.size, lr=args.lr)
        files = trainer.model_files(state / "model")
        params = sum(p.numel() for p in trainer.model.parameters())
        runs: list[dict[str, Any]] = []
        for replicas in counts:
            for design in args.designs.split(","):
                too_many = args.naive_up_to is not None and replicas > args.naive_up_to
                if design == "naive" and too_many:
                    continue
                with LoadSampler() as load:
                    run = run_design(
                        regions,
                        trainer,
                        files,
                        state / "work",
                        design=design,
                        replicas=replicas,
                        deltas=args.deltas,
                        rate_kb_s=args.wan_rate,
                        latency_ms=args.wan_latency,
                        say=say,
                    )
                runs.append({**run, "load": load.summary()})
                # After every run: a later failure keeps what was measured.
                _write(args, command, params, runs)
    finally:
        down(state)
        reaper.terminate()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def _fit(points: dict[int, float]) -> tuple[float, float]:
    """Intercept and slope of the line through the smallest and the largest count."""
    (x0, y0), (x1, y1) = sorted(points.items())[0], sorted(points.items())[-1]
    slope = (y1 - y0) / (x1 - x0)
    return y0 - slope * x0, slope


def projected(
    runs: list[dict[str, Any]], requested: list[int], rate_kb_s: int, latency_ms: int
) -> list[dict[str, Any]]:
    """Rows for the replica counts asked for but not measured, per design. Never a
    measurement: marked as projected, with the counts they come from.

    Per snapshot, a design's WAN bytes (and its busiest link's) are modelled in units of the
    delta's stored size from the runs measured (at least two counts): ``naive`` grows by one
    copy of the delta per replica (the line through the smallest and the largest count),
    ``regional`` has no per-replica term (the median of the measured ratios, flat). That is
    scaled by the delta stored at that count (``regional``'s when it ran there, else the
    median of every run's).
    """
    everything = [d["stored_bytes"] for r in runs for d in r["deltas"]]
    regional_counts = {r["replicas_per_region"] for r in runs if r["design"] == "regional"}
    rows = []
    for design in ("regional", "naive"):
        measured = {
            r["replicas_per_region"]: r for r in runs if r["design"] == design and r["deltas"]
        }
        wanted = sorted((set(requested) | regional_counts) - set(measured))
        if len(measured) < 2 or not wanted:
            continue

        def per_delta(key: str, measured: dict[int, Any] = measured) -> dict[int, float]:
            return {
                count: _median([d[key] / d["stored_bytes"] for d in run["deltas"]])
                for count, run in measured.items()
            }

        if design == "naive":
            total, busiest = _fit(per_delta("wan_bytes")), _fit(per_delta("busiest_link_bytes"))
        else:  # no per-replica term: the runs' median ratio, flat
            total = (_median(list(per_delta("wan_bytes").values())), 0.0)
            busiest = (_median(list(per_delta("busiest_link_bytes").values())), 0.0)
        for count in wanted:
            there = [
                d["stored_bytes"]
                for r in runs
                if r["design"] == "regional" and r["replicas_per_region"] == count
                for d in r["deltas"]
            ]
            stored = _median(there or everything)
            busy = stored * (busiest[0] + busiest[1] * count)
            rows.append(
                {
                    "design": design,
                    "replicas_per_region": count,
                    "projected_from": sorted(measured),
                    "stored_bytes": round(stored),
                    "wan_bytes": round(stored * (total[0] + total[1] * count)),
                    "busiest_link_bytes": round(busy),
                    "floor_seconds": round(busy / (rate_kb_s * 1000) + latency_ms / 1000, 3)
                    if rate_kb_s
                    else None,
                }
            )
    return rows


def _write(args: argparse.Namespace, command: str, params: int, runs: list[dict[str, Any]]) -> None:
    meta = {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "model": f"reference engine, size {args.size}, {params:,} parameters, AdamW lr {args.lr}",
        "wan": f"{args.wan_rate} KB/s each way, {args.wan_latency} ms one way, per region link",
        "wan_rate_kb_s": args.wan_rate,
        "wan_latency_ms": args.wan_latency,
        "replicas_requested": [int(n) for n in args.replicas.split(",")],
        "note": args.note,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    report(meta, runs, args.out)


def report(meta: dict[str, Any], runs: list[dict[str, Any]], out: Path) -> None:
    """results.json (with the projected rows) and results.md (``--report-only`` rereads)."""
    command = meta["command"]
    rows_projected = projected(
        runs, meta["replicas_requested"], meta["wan_rate_kb_s"], meta["wan_latency_ms"]
    )
    (out / "results.json").write_text(
        json.dumps({**meta, "runs": runs, "projected": rows_projected}, indent=2) + "\n"
    )
    lines = [
        "# Transfer benchmark: bytes over the WAN per snapshot, three regions",
        "",
        f"Command: `{command}`  ",
        f"Date: {meta['date']}  ",
        f"Machine: {meta['machine']}  ",
        f"Model: {meta['model']}  ",
        f"WAN: {meta['wan']}; `noop`-engine replicas (real sidecars, shared runtime mode).",
        "",
        "`regional` (hotload): each region's replicas read their own bucket; the home bucket "
        "replicates to the others. `naive` (baseline, same process): every replica pulls from "
        "the trainer's bucket across the WAN. Medians over the deltas.",
        "",
        "| design | replicas/region | delta stored B | WAN B per snapshot | WAN / (delta x 3) "
        "| publish -> all Ready s (slowest region) | link floor s "
        "| machine load (1 min) median / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        rows = run["deltas"]
        stored = _median([r["stored_bytes"] for r in rows])
        crossed = _median([r["wan_bytes"] for r in rows])
        ready = _median([max(v or 0 for v in r["ready_seconds"].values()) for r in rows])
        floor = _median([r["floor_seconds"] or 0 for r in rows])
        load = run.get("load") or {}
        lines.append(
            f"| {run['design']} | {run['replicas_per_region']} | {stored:,.0f} | {crossed:,.0f} "
            f"| {crossed / (stored * 3):.2f} | {ready:.1f} | {floor:.3f} "
            f"| {load.get('load1_median', '-')} / {load.get('load1_max', '-')} |"
        )
    for row in rows_projected:
        lines.append(
            f"| {row['design']} (projected) | {row['replicas_per_region']} "
            f"| {row['stored_bytes']:,} | {row['wan_bytes']:,} "
            f"| {row['wan_bytes'] / (row['stored_bytes'] * 3):.2f} "
            f"| not run | {row['floor_seconds'] or 0:.3f} | - |"
        )
    if rows_projected:
        lines += [
            "",
            "`(projected)` rows are not measurements. Per snapshot, a design's WAN bytes come "
            "from its measured runs ("
            + "; ".join(
                f"{design} at {' and '.join(str(c) for c in fitted)} replicas per region"
                for design, fitted in sorted(
                    {r["design"]: r["projected_from"] for r in rows_projected}.items()
                )
            )
            + "), in units of the delta's stored size: naive, the line through them (one copy "
            "per replica, plus the upload and requests); regional, their median ratio, flat "
            "(one copy per region whatever the replicas). Times the median delta stored; the "
            "link floor follows from the busiest link's bytes the same way.",
        ]
    if meta.get("note"):
        lines += ["", str(meta["note"])]
    lines += [
        "",
        "WAN bytes count both directions of every region's link (toxiproxy's counters, HTTP "
        "and replication overhead included). The link floor is what the busiest link alone "
        "needs: its bytes at the link's rate plus its latency (regional: one copy of the "
        "delta; naive: every replica's copy through the home region's link). The first Full "
        "of each run only starts the replicas and crosses unlimited links; it is not measured.",
        "",
        "The machine is shared (2 cores, other work running): read times as an order of "
        "magnitude; byte counts are exact.",
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
