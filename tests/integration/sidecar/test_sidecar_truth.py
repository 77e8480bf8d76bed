"""A replica's report is always the truth: faults injected into real replicas.

One fleet for the whole module (pods start once; each test begins by converging on a
fresh snapshot): deployment ``truth`` (ASYNC, two replicas) and ``slow`` (SYNC, one
replica whose sidecar drains SYNC swaps for at most 3 s; tests make its engine slow to
swap through the engine's ``/admin/swap_delay``). Real ``hotload engine reference`` and
``hotload sidecar`` processes run by the pod runtime; faults are injected by killing
processes, moving targets, writing to the pod as another writer and editing files.
Targets are moved by hand (namespace ``t-*``: no operator watches it).

Every test names the numbered failure of issue 15 it reproduces; each fails on the code
before the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from hotload.api import SnapshotRef, Transition
from hotload.local import LocalRegions, Region, control_plane
from hotload.local.components import region_tools
from hotload.local.processes import read_records, start, stop, wait_ready
from hotload.local.trainer import PublishedSnapshot
from hotload.storage import Storage, open_storage
from tests.fixtures.trainer import PROBE_TOKENS, Trainer
from tests.integration.sidecar.harness import (
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
    token_delay,
)

pytestmark = pytest.mark.cluster

DRAIN_TIMEOUT_S = 3.0


@dataclass
class Fleet:
    harness: SidecarHarness
    trainer: Trainer
    storage: Storage
    truth: list[Replica]
    slow: Replica


@pytest.fixture(scope="module")
def fleet(
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    region = local_regions.regions[0]
    api = kube_clients[region.name]
    namespace = f"t-truth-{secrets.token_hex(3)}"
    core = k8s.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    workdir = tmp_path_factory.mktemp("truth")
    bucket = workdir / "bucket"
    bucket.mkdir()
    storage = open_storage(f"file://{bucket}")
    trainer = Trainer(workdir / "trainer", storage)
    harness = SidecarHarness(api, region, namespace, workdir / "pods")
    harness.workdir.mkdir()
    try:
        harness.create_deployment(rollout_deployment("truth", f"file://{bucket}"))
        harness.create_deployment(
            rollout_deployment("slow", f"file://{bucket}", transition=Transition.SYNC)
        )
        for name in ("truth-0", "truth-1"):
            harness.create_replica(name, "truth")
        harness.create_replica(
            "slow-0", "slow", sidecar_args=("--sync-drain-timeout", str(DRAIN_TIMEOUT_S))
        )

        async def start() -> tuple[list[Replica], Replica]:
            replicas = [
                await harness.addressed("truth-0", "truth"),
                await harness.addressed("truth-1", "truth"),
                await harness.addressed("slow-0", "slow"),
            ]
            await asyncio.gather(*(harness.wait_serving(r, timeout=240) for r in replicas))
            await trainer.publish_full()
            return replicas[:2], replicas[2]

        truth, slow = asyncio.run(start())
        yield Fleet(harness, trainer, storage, truth, slow)
    finally:
        harness.stop_all()
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespace(namespace)


# --- helpers ---------------------------------------------------------------------------


async def converge(
    fleet: Fleet, deployment: str, replicas: list[Replica], snapshot: PublishedSnapshot
) -> None:
    """Move ``deployment``'s target to ``snapshot`` and wait until every replica serves it
    and its staging caught up (the served buffer holds it: a delta patched in the engine
    is staged after Ready, off the critical path)."""
    fleet.harness.set_target(deployment, snapshot.ref())
    for replica in replicas:
        await fleet.harness.wait_state(replica, snapshot.identity, "Ready", timeout=120)
    for replica in replicas:
        # The condition is a patch of its own, after the annotations'.
        await eventually(
            lambda r=replica: (
                (gate := fleet.harness.gate(r.pod)) is not None and gate.status == "True"
            ),
            timeout=30,
            what=f"{replica.pod} readiness gate",
        )
        await assert_serves(fleet, replica, snapshot)
        await staged(fleet, replica, snapshot)


async def staged(fleet: Fleet, replica: Replica, snapshot: PublishedSnapshot) -> None:
    """Wait until the replica's served buffer holds ``snapshot`` and none is handed."""

    async def caught_up() -> bool:
        buffers = (await fleet.harness.status(replica))["buffers"]
        served = buffers["served"]
        return served is not None and buffers[served] == snapshot.identity and not buffers["handed"]

    await eventually(caught_up, timeout=60, what=f"{replica.pod} staging {snapshot.identity}")


async def fresh_delta(fleet: Fleet) -> PublishedSnapshot:
    fleet.trainer.train_step()
    return await fleet.trainer.publish_delta()


async def assert_serves(fleet: Fleet, replica: Replica, snapshot: PublishedSnapshot) -> None:
    """The engine serves ``snapshot`` bit for bit, and everything the pod says agrees."""
    served = await fleet.harness.engine_logits(replica, PROBE_TOKENS)
    assert served["identity"] == snapshot.identity
    assert served["sha256"] == fleet.trainer.expected_logits(snapshot).sha256
    annotations = fleet.harness.annotations(replica.pod)
    assert annotations["hotload.dev/snapshot"] == snapshot.identity
    gate = fleet.harness.gate(replica.pod)
    assert gate is not None and gate.status == "True", gate
    status = await fleet.harness.status(replica)
    assert status["current"]["identity"] == snapshot.identity
    metrics = await get_text(f"{replica.front}/metrics")
    info = [line for line in metrics.splitlines() if line.startswith("hotload_snapshot_info{")]
    assert len(info) == 1 and f'identity="{snapshot.identity}"' in info[0], info


async def get_text(url: str) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(url, timeout=10)
        response.raise_for_status()
        return response.text


async def engine_state(replica: Replica) -> dict[str, Any] | None:
    """The engine's own ``/admin/identity``, or None while it does not answer."""
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{replica.engine_url}/admin/identity", timeout=2)
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body
    except httpx.HTTPError:
        return None


async def swap_delay(replica: Replica, seconds: float) -> None:
    """Make the engine slow to swap (seconds between reading files and swapping them in)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(
            f"{replica.engine_url}/admin/swap_delay", json={"seconds": seconds}, timeout=10
        )
        response.raise_for_status()


async def stream_labels(replica: Replica, max_tokens: int) -> tuple[str | None, list[str]]:
    """A streamed completion through the front: its header and every chunk's ``model``."""
    body = {
        "model": replica.env["HOTLOAD_DEPLOYMENT"],
        "prompt": "The truth is",
        "max_tokens": max_tokens,
        "stream": True,
    }
    models: list[str] = []
    async with (
        httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30, read=120)) as client,
        client.stream("POST", f"{replica.front}/v1/completions", json=body) as response,
    ):
        if response.status_code != 200:
            return response.headers.get("x-hotload-policy"), []
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                models.append(json.loads(line[6:])["model"])
        return response.headers.get("x-hotload-policy"), models


# --- 1. the engine restarted -----------------------------------------------------------


async def test_1_a_restarted_engine_is_reloaded_and_the_pod_stops_claiming_it_at_once(
    fleet: Fleet,
) -> None:
    harness = fleet.harness
    snapshot = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, snapshot)
    replica = fleet.truth[0]
    before = await engine_state(replica)
    assert before is not None

    harness.kill(replica, "engine")
    restarted_at: float | None = None
    claims_after_restart: list[float] = []
    mislabelled: list[tuple[str | None, list[str]]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        engine = await engine_state(replica)
        annotations = harness.annotations(replica.pod)
        gate = harness.gate(replica.pod)
        now = time.monotonic()
        if engine is not None and engine["instance_id"] != before["instance_id"]:
            if restarted_at is None:
                restarted_at = now
            pod_claims = (
                annotations.get("hotload.dev/snapshot") == snapshot.identity
                and gate is not None
                and gate.status == "True"
            )
            if engine["identity"] != snapshot.identity and pod_claims:
                claims_after_restart.append(now - restarted_at)
            header, models = await stream_labels(replica, 4)
            if models and models[0] != f"truth@{header}":
                mislabelled.append((header, models))
            if engine["identity"] == snapshot.identity and (
                annotations.get("hotload.dev/state") == "Ready"
                and annotations.get("hotload.dev/via") == "reload"
            ):
                break
        await asyncio.sleep(0.2)
    assert restarted_at is not None, "the runtime did not restart the engine"
    # What the pod says follows the engine within one check (5 s) and some slack.
    assert not claims_after_restart or max(claims_after_restart) < 8.0, claims_after_restart
    assert not mislabelled, (
        f"a stream's header named other weights than its first chunk: {mislabelled}"
    )
    annotations = await harness.wait_state(replica, snapshot.identity, "Ready", timeout=60)
    assert annotations["hotload.dev/via"] == "reload"
    await assert_serves(fleet, replica, snapshot)
    status = await harness.status(replica)
    assert status["history"][0]["via"] == "reload"
    assert status["engineSeen"]["instanceId"] != before["instance_id"]


# --- 2. a load in flight when the sidecar died ------------------------------------------


async def test_2_a_load_in_flight_when_the_sidecar_dies_is_never_patched_under_the_engine(
    fleet: Fleet,
) -> None:
    harness, trainer = fleet.harness, fleet.trainer
    replica = fleet.slow
    base = await fresh_delta(fleet)
    await converge(fleet, "slow", [replica], base)
    # Two deltas ahead: the engine cannot patch the step in place, the sidecar hands it a
    # rebuilt buffer (the path whose in-flight load this test is about).
    await fresh_delta(fleet)
    pending = await fresh_delta(fleet)
    newer = await fresh_delta(fleet)
    expected = {s.identity: trainer.expected_logits(s).sha256 for s in (base, pending, newer)}
    restarts = harness.container_status(replica.pod, "sidecar")
    restart_count = restarts.restart_count if restarts else 0
    # Long enough that the restarted sidecar is back while the engine still holds the
    # pending load's files open, not yet swapped in.
    await swap_delay(replica, 15.0)

    harness.set_target("slow", pending.ref())

    async def loading() -> bool:
        engine = await engine_state(replica)
        return bool(engine and engine.get("loading") == pending.identity)

    await eventually(loading, timeout=60, what="the engine to be in the middle of the load")
    harness.kill_sidecar(replica)
    harness.set_target("slow", newer.ref())

    samples: list[tuple[str, str]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            served = await harness.engine_logits(replica, PROBE_TOKENS)
            samples.append((served["identity"], served["sha256"]))
        annotations = harness.annotations(replica.pod)
        if (
            annotations.get("hotload.dev/target") == newer.identity
            and annotations.get("hotload.dev/state") == "Ready"
        ):
            break
        await asyncio.sleep(0.3)
    wrong = [(identity, sha) for identity, sha in samples if expected.get(identity) != sha]
    assert not wrong, (
        f"the engine served weights other than the ones it named: {wrong[:3]}\n"
        + harness.log(replica, "sidecar", tail=20000)
    )
    assert {identity for identity, _ in samples} >= {pending.identity, newer.identity}
    await swap_delay(replica, 0.0)
    await harness.wait_restarted(replica, restart_count + 1)
    await harness.wait_state(replica, newer.identity, "Ready", timeout=60)
    await assert_serves(fleet, replica, newer)


# --- 3. preemption ---------------------------------------------------------------------


async def test_3_targets_moved_faster_than_loads_finish_still_converge(fleet: Fleet) -> None:
    harness = fleet.harness
    start = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, start)
    rng = random.Random(15)
    for round_ in range(3):
        snapshots = [await fresh_delta(fleet) for _ in range(4)]
        if round_ == 1:
            snapshots.append(await fleet.trainer.publish_full())
        states: set[str] = set()
        for snapshot in snapshots:
            harness.set_target("truth", snapshot.ref())
            await asyncio.sleep(rng.uniform(0.03, 0.07))
            for replica in fleet.truth:
                states.add(harness.annotations(replica.pod).get("hotload.dev/state", ""))
        last = snapshots[-1]
        for replica in fleet.truth:
            annotations = await harness.wait_state(replica, last.identity, "Ready", timeout=120)
            assert "hotload.dev/reason" not in annotations
        assert "Failed" not in states, f"round {round_}: a replica failed while preempted"
        for replica in fleet.truth:
            status = await harness.status(replica)
            assert (status.get("lastError") or {}).get("reason") != "InternalError", status
            await assert_serves(fleet, replica, last)
            await staged(fleet, replica, last)
            leftovers = [
                p for p in (replica.staging / "buffers").rglob("*") if ".partial-" in p.name
            ]
            assert not leftovers, leftovers


# --- 4. foreign writes -----------------------------------------------------------------


async def test_4_another_writers_changes_to_the_pod_are_repaired(fleet: Fleet) -> None:
    harness = fleet.harness
    snapshot = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, snapshot)
    replica = fleet.truth[1]
    await eventually(
        lambda: _condition(harness, replica, "Ready") == "True",
        timeout=60,
        what="the pod to be Ready",
    )
    harness.core.patch_namespaced_pod(
        replica.pod,
        harness.namespace,
        {
            "metadata": {
                "annotations": {
                    "hotload.dev/snapshot": "someone-else",
                    "hotload.dev/state": "Failed",
                    "hotload.dev/reason": "ChecksumMismatch",
                    "hotload.dev/via": None,
                }
            }
        },
    )
    harness.core.patch_namespaced_pod_status(
        replica.pod,
        harness.namespace,
        {
            "status": {
                "conditions": [
                    {"type": "hotload.dev/SnapshotReady", "status": "False", "reason": "Forged"},
                    {"type": "Ready", "status": "False", "reason": "NodeNotReady"},
                ]
            }
        },
    )

    def repaired() -> bool:
        annotations = harness.annotations(replica.pod)
        return (
            annotations.get("hotload.dev/snapshot") == snapshot.identity
            and annotations.get("hotload.dev/state") == "Ready"
            and annotations.get("hotload.dev/via") == "delta"
            and "hotload.dev/reason" not in annotations
            and _condition(harness, replica, "hotload.dev/SnapshotReady") == "True"
            and _condition(harness, replica, "Ready") == "True"
        )

    await eventually(repaired, timeout=45, what="the sidecar and the runtime to repair the pod")
    gate = harness.gate(replica.pod)
    assert gate is not None and gate.reason == "Verified"


def _condition(harness: SidecarHarness, replica: Replica, kind: str) -> str | None:
    pod = harness.pod(replica.pod)
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == kind:
            return str(condition.status)
    return None


# --- 5. a file named x.part ------------------------------------------------------------


async def test_5_a_snapshot_may_hold_both_x_and_x_part(fleet: Fleet) -> None:
    extra = {"notes.txt": b"what the trainer says", "notes.txt.part": b"a file, not a download"}
    fleet.trainer.train_step()
    full = await fleet.trainer.publish_full(extra_files=extra)
    await converge(fleet, "truth", fleet.truth, full)
    delta = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, delta)
    for replica in fleet.truth:
        status = await fleet.harness.status(replica)
        served = status["buffers"]["served"]
        directory = replica.staging / "buffers" / served / delta.identity
        for name, data in extra.items():
            assert (directory / name).read_bytes() == data


# --- 6. local corruption ---------------------------------------------------------------


async def test_6_a_bit_flipped_in_staging_is_repaired_from_the_bucket_never_reported(
    fleet: Fleet,
) -> None:
    harness = fleet.harness
    snapshot = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, snapshot)
    replica = fleet.truth[0]
    flipped = [flip_bit(shard) for shard in rebuilt_shards(replica)]
    assert flipped, "nothing staged to damage"
    # Two deltas ahead: no in-engine patch, the target is rebuilt from the damaged buffers.
    await fresh_delta(fleet)
    nxt = await fresh_delta(fleet)
    harness.set_target("truth", nxt.ref())
    states: set[str] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        annotations = harness.annotations(replica.pod)
        states.add(annotations.get("hotload.dev/state", ""))
        if (
            annotations.get("hotload.dev/target") == nxt.identity
            and annotations.get("hotload.dev/state") == "Ready"
        ):
            break
        await asyncio.sleep(0.2)
    assert "Failed" not in states, "a local corruption was reported as a broken chain"
    await assert_serves(fleet, replica, nxt)
    status = await harness.status(replica)
    assert status["history"][0]["via"] == "replay", "replayed from the Full, fetched again"
    # The chain goes on by deltas afterwards.
    after = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, after)
    assert harness.annotations(replica.pod)["hotload.dev/via"] == "delta"


def rebuilt_shards(replica: Replica) -> list[Path]:
    """Every rebuilt model file in the replica's staging (downloads excluded)."""
    return [
        path
        for path in replica.staging.rglob("model.safetensors")
        if not {"fetch", "partial"} & set(path.relative_to(replica.staging).parts)
    ]


def flip_bit(path: Path) -> Path:
    """One bit of tensor data flipped in place, as a bad disk or a stray writer would."""
    data = bytearray(path.read_bytes())
    data[len(data) - 64] ^= 0x10
    path.write_bytes(bytes(data))
    return path


# --- 7. a corrected target -------------------------------------------------------------


async def test_7_a_target_corrected_in_its_step_alone_is_retried(fleet: Fleet) -> None:
    harness = fleet.harness
    snapshot = await fresh_delta(fleet)
    replica = fleet.truth[1]
    wrong = SnapshotRef(
        identity=snapshot.identity,
        step=snapshot.step + 100,
        kind=snapshot.kind,
        kv_cache_policy=snapshot.ref().kv_cache_policy,
    )
    harness.set_target("truth", wrong)
    annotations = await harness.wait_state(replica, snapshot.identity, "Failed", timeout=60)
    assert annotations["hotload.dev/reason"] == "TargetInconsistent"  # never a chain break
    assert annotations["hotload.dev/failed-snapshot"] == snapshot.identity
    await converge(fleet, "truth", fleet.truth, snapshot)


# --- 8. smaller ones -------------------------------------------------------------------


async def test_8_a_sync_drain_has_a_limit_and_refusals_name_the_policy(fleet: Fleet) -> None:
    harness = fleet.harness
    replica = fleet.slow
    old = await fresh_delta(fleet)
    await converge(fleet, "slow", [replica], old)
    new = await fresh_delta(fleet)
    # ~10 s of tokens, far beyond the 3 s drain limit on any machine.
    await token_delay(replica, 0.005)
    try:
        stream = asyncio.create_task(stream_labels(replica, 2000))

        async def streaming() -> bool:
            if stream.done():
                raise AssertionError("the stream ended before the swap was asked for")
            engine = await engine_state(replica)
            return bool(engine and engine["active_generations"])

        await eventually(streaming, timeout=30, what="the stream to run in the engine")
        harness.set_target("slow", new.ref())
        await _drain_is_limited(fleet, replica, old, new, stream)
    finally:
        await token_delay(replica, 0.0)


async def _drain_is_limited(
    fleet: Fleet,
    replica: Replica,
    old: PublishedSnapshot,
    new: PublishedSnapshot,
    stream: asyncio.Task[tuple[str | None, list[str]]],
) -> None:
    harness = fleet.harness

    async def draining() -> bool:
        # "Draining" names the wait; a sidecar without the phase said "Swapping".
        return (await harness.status(replica))["phase"] in ("Draining", "Swapping")

    await eventually(draining, timeout=60, what="the SYNC swap to drain")
    early = await harness.complete(replica)
    assert early.status_code == 425
    assert early.headers["x-hotload-policy"] == old.identity
    await harness.wait_state(replica, new.identity, "Ready", timeout=60)
    assert not stream.done(), "the swap waited for the endless stream"
    header, models = await stream
    assert header == old.identity
    first_new = models.index(f"slow@{new.identity}")
    assert set(models[:first_new]) == {f"slow@{old.identity}"}
    assert set(models[first_new:]) == {f"slow@{new.identity}"}


async def test_8_an_engine_busy_swap_is_retried_without_rebuilding(fleet: Fleet) -> None:
    harness = fleet.harness
    replica = fleet.slow
    current = await fresh_delta(fleet)
    await converge(fleet, "slow", [replica], current)
    served_dir = next(
        p.parent for p in rebuilt_shards(replica) if p.parent.name == current.identity
    )
    served_path = f"/var/lib/hotload/staging/{served_dir.relative_to(replica.staging)}"
    nxt = await fresh_delta(fleet)

    async def foreign_load() -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            await client.post(
                f"{replica.engine_url}/admin/load",
                json={"path": served_path, "identity": current.identity, "kind": "Incremental"},
                timeout=60,
            )

    await swap_delay(replica, 4.0)
    busy = asyncio.create_task(foreign_load())

    async def loading() -> bool:
        engine = await engine_state(replica)
        return bool(engine and engine.get("loading") == current.identity)

    await eventually(loading, timeout=30, what="the foreign load to hold the engine")
    harness.set_target("slow", nxt.ref())
    try:
        await harness.wait_state(replica, nxt.identity, "Ready", timeout=90)
    finally:
        await swap_delay(replica, 0.0)
    await busy
    await assert_serves(fleet, replica, nxt)
    status = await harness.status(replica)
    failures = await get_text(f"{replica.front}/metrics")
    assert 'hotload_failures_total{reason="EngineBusy"}' in failures
    swap = status["history"][0]
    assert swap["identity"] == nxt.identity
    assert "rebuild" not in swap["seconds"] and swap["fetchedBytes"] == 0, swap


def restart_api_server(region: Region, down_s: float) -> None:
    """Stop the region's kube-apiserver, keep it down ``down_s``, start it again."""
    records = [r for r in read_records(region.pids_dir) if r.name == "kube-apiserver"]
    assert records, "no kube-apiserver record"
    stop(records)
    time.sleep(down_s)
    spec = control_plane.apiserver(region, region_tools(region))
    wait_ready([(spec, start(spec, region.logs_dir, region.pids_dir))], region.name)


async def test_8_the_first_target_after_an_api_server_outage_is_seen_within_seconds(
    fleet: Fleet,
) -> None:
    harness = fleet.harness
    snapshot = await fresh_delta(fleet)
    await converge(fleet, "truth", fleet.truth, snapshot)
    nxt = await fresh_delta(fleet)
    # Long enough for the watches' backoff to grow (to 8-30 s before the fix).
    await asyncio.to_thread(restart_api_server, harness.region, 20.0)
    seen_by: dict[str, float] = {}
    await eventually(
        lambda: _settable(harness), timeout=60, what="the API server to take writes again"
    )
    started = time.monotonic()
    harness.set_target("truth", nxt.ref())
    while len(seen_by) < len(fleet.truth) and time.monotonic() - started < 60:
        for replica in fleet.truth:
            with contextlib.suppress(httpx.HTTPError):
                status = await harness.status(replica)
                if (status.get("target") or {}).get("identity") == nxt.identity:
                    seen_by.setdefault(replica.pod, time.monotonic() - started)
        await asyncio.sleep(0.1)
    assert len(seen_by) == len(fleet.truth), seen_by
    assert max(seen_by.values()) < 7.0, f"the new target reached the sidecars late: {seen_by}"
    for replica in fleet.truth:
        waits = api_retry_delays(harness.log(replica, "sidecar", tail=200_000))
        assert waits, "the outage was seen by the sidecar"
        assert max(waits) <= 4.0, f"{replica.pod} waited {max(waits)} s between API retries"
    for replica in fleet.truth:
        await harness.wait_state(replica, nxt.identity, "Ready", timeout=60)
        await eventually(
            lambda r=replica: _condition(harness, r, "Ready") == "True",
            timeout=60,
            what=f"{replica.pod} Ready again after the outage",
        )
        await assert_serves(fleet, replica, nxt)


def api_retry_delays(log_text: str) -> list[float]:
    """The delays the sidecar waited between retries of its watch and its pod report."""
    delays = []
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("message") in (
                "deployment watch failed, retrying",
                "writing the pod report failed, retrying",
            ):
                delays.append(float(record["retry_in_s"]))
    return delays


def _settable(harness: SidecarHarness) -> bool:
    try:
        harness.core.list_namespaced_pod(harness.namespace, _request_timeout=5)
    except Exception:  # any failure means: not back yet
        return False
    return True
