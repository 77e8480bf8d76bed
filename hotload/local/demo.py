"""The main job on the embedded default: local regions, the hotload chart installed with helm,
a ``file://`` bucket, the reference engine. Publish snapshots, break one, watch the operator.

What it does, in order (each step one function, so a longer demo adds steps, not branches):

1. brings the local regions up (or reuses them), one real control plane per region;
2. installs ``charts/hotload`` into each region with the pinned ``helm`` and waits until the
   operator Deployment (two replicas, kopf peering) is available: the pod runtime runs its
   pods' real ``hotload operator`` processes with their own pod-bound tokens;
3. applies a RolloutDeployment in each region; the operator renders its StatefulSet,
   Service and sidecar RBAC, and the pod runtime runs every replica's real ``hotload engine
   reference`` and ``hotload sidecar`` processes;
4. trains the reference model for real and publishes a Full snapshot and then deltas to the
   bucket (manifest last); applies each PolicySnapshot to every region and waits on its
   ``Ready`` condition, which the operator sets once every replica serves it, verified;
5. publishes one more delta and flips a byte of one of its files in the bucket: the replicas
   refuse it (checksum), the operator marks the snapshot ``ChainValid=False``, the deployment
   ``Degraded``, emits an Event, and every replica keeps serving the last good snapshot; the
   next Full clears it;
6. asks each region's Service for a completion (which policy answers), and ends with
   ``hotload ledger``: every replica, what it serves, and how it got there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from hotload.api import RolloutDeployment
from hotload.api import pod as contract
from hotload.api.conditions import CHAIN_VALID, DEGRADED, READY, ConditionStatus
from hotload.api.reasons import CHAIN_BREAKING_REASONS
from hotload.errors import LocalRegionError
from hotload.local import chart
from hotload.local import lifecycle as local_regions
from hotload.local.demo_region import RegionSession
from hotload.local.region import Region, default_names
from hotload.local.trainer import PolicyTrainer, PublishedSnapshot
from hotload.storage import Storage, open_storage

log = logging.getLogger(__name__)

DEPLOYMENT: Final = "demo"
SERVED_NAME: Final = "policy"
MANIFEST: Final = "hotload-manifest.json"
Say = Callable[[str], None]


@dataclass(frozen=True)
class DemoSettings:
    regions: int = 2
    replicas: int = 2
    deltas: int = 4
    """Deltas published after the first Full."""
    namespace: str = "hotload-demo"
    state_dir: Path | None = None
    index_base: int = 1
    size: str = "tiny"
    lr: float = 1e-5
    ready_timeout_s: float = 300.0
    break_chain: bool = True
    """Corrupt one delta in the bucket and show the fallback to the next Full."""
    chart: chart.ChartRelease = field(default_factory=chart.ChartRelease)
    """The release installed into every region (default: the operator watches everything)."""


@dataclass
class RolloutTiming:
    snapshot: PublishedSnapshot
    seconds_by_region: dict[str, float] = field(default_factory=dict)
    """Apply → the PolicySnapshot's Ready condition, as the demo saw it."""
    reason_by_region: dict[str, str] = field(default_factory=dict)
    """Ready's reason: Rolled (it is the target) or Superseded (a newer one is)."""


@dataclass
class BrokenChain:
    """What the demo saw while one delta in the bucket was corrupt."""

    snapshot: PublishedSnapshot
    corrupted_key: str
    last_good: str
    chain_reason_by_region: dict[str, str] = field(default_factory=dict)
    degraded_reason_by_region: dict[str, str] = field(default_factory=dict)
    events_by_region: dict[str, list[str]] = field(default_factory=dict)
    served_by_region: dict[str, dict[str, str | None]] = field(default_factory=dict)
    """Each replica's served snapshot while the chain was broken."""
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    recovery: RolloutTiming | None = None
    degraded_after_recovery: dict[str, str] = field(default_factory=dict)
    """Region → Degraded's status after the next Full (``False`` once cleared)."""


@dataclass
class DemoResult:
    timings: list[RolloutTiming] = field(default_factory=list)
    broken: BrokenChain | None = None
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Region → (the ``model`` a completion named, its ``x-hotload-policy`` header)."""
    ledger: str = ""
    """What ``hotload ledger`` printed at the end."""


def run_demo(settings: DemoSettings, say: Say = print) -> DemoResult:
    """Run the whole demo and return what it observed (the e2e test asserts on it)."""
    names = default_names(settings.regions)
    say(f"bringing up {settings.regions} local regions (real etcd, kube-apiserver, kwok) …")
    regions = local_regions.up(names, state_dir=settings.state_dir, index_base=settings.index_base)
    install_operator(regions.regions, settings.chart, say)
    sessions = [RegionSession(regions.region(n), settings.namespace, DEPLOYMENT) for n in names]
    try:
        bucket = regions.state_dir / "demo-bucket"
        bucket.mkdir(parents=True, exist_ok=True)
        for session in sessions:
            apply_deployment(session, bucket, settings.replicas)
            say(f"{session.name}: RolloutDeployment/{DEPLOYMENT}, {settings.replicas} replicas")
        storage = open_storage(f"file://{bucket}")
        trainer = _trainer(regions.state_dir, storage, settings, sessions)
        result = DemoResult()
        for number in range(settings.deltas + 1):
            if number:
                trainer.train_step()
            snapshot = asyncio.run(trainer.publish(full=number == 0))
            result.timings.append(roll_out(sessions, snapshot, settings, say))
        if settings.break_chain:
            result.broken = break_and_recover(sessions, trainer, storage, settings, say)
        result.answers = ask_fronts(sessions, say)
        show_objects(sessions[0], say)
        result.ledger = show_ledger(regions.kubeconfig, sessions, say)
    finally:
        for session in sessions:
            session.close()
    say(
        f"done. Look around: kubectl --kubeconfig {regions.kubeconfig} get rd,psnap,pods -A\n"
        "stop with: hotload local down"
    )
    return result


def install_operator(regions: Sequence[Region], release: chart.ChartRelease, say: Say) -> None:
    """``helm upgrade --install`` the chart everywhere, then wait for the operator."""
    say(f"helm install {release.release} charts/hotload into each region …")
    started = time.monotonic()
    chart.install(regions, release)
    chart.wait_operator(regions, release)
    say(
        f"  hotload operator available in every region ({time.monotonic() - started:.0f} s): "
        f"deploy/{release.operator_deployment} in {release.namespace}, "
        f"{release.operator_replicas} replicas peering"
    )


def deployment_manifest(bucket: Path, replicas: int) -> dict[str, Any]:
    deployment = RolloutDeployment.model_validate(
        {
            "metadata": {"name": DEPLOYMENT},
            "spec": {
                "model": {"name": "hotload-tiny-qwen2", "servedName": SERVED_NAME},
                "engine": {"kind": "reference", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                "replicas": replicas,
                "hotLoad": {
                    "bucketUrl": f"file://{bucket}",
                    "transition": "ASYNC",
                    "kvCachePolicy": "new_session",
                },
                "scheduling": {"tolerations": [dict(t) for t in chart.LOCAL_TOLERATIONS]},
            },
        }
    )
    return deployment.to_k8s()


def apply_deployment(session: RegionSession, bucket: Path, replicas: int) -> None:
    """The namespace and the RolloutDeployment; the operator makes the rest."""
    session.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": session.namespace}}
    )
    session.apply(deployment_manifest(bucket, replicas))


def _trainer(
    state_dir: Path, storage: Storage, settings: DemoSettings, sessions: Sequence[RegionSession]
) -> PolicyTrainer:
    """A fresh trainer whose steps continue after any snapshot an earlier run left: targets
    only move forward, so a rerun on the same regions starts above the last step."""
    run = format(int(time.time()) % 36**6, "x")
    trainer = PolicyTrainer(
        state_dir / "demo-trainer" / run,
        storage,
        name=f"{DEPLOYMENT}-{run}",
        size=settings.size,
        lr=settings.lr,
    )
    steps = [s.spec.step for session in sessions for s in session.snapshots()]
    trainer.step = max(steps) + 1 if steps else 0
    return trainer


def _describe(snapshot: PublishedSnapshot) -> str:
    text = f"{snapshot.identity} ({snapshot.kind.value}, step {snapshot.step}"
    if snapshot.previous:
        text += f", loss {snapshot.loss:.3f}"
    text += f"): {snapshot.stored_bytes:,} bytes stored"
    if snapshot.previous:
        text += f", {snapshot.ratio:.0f}x smaller than the full weights"
    return text


def _snapshot_problems(session: RegionSession, identity: str) -> str:
    """What a PolicySnapshot says when it is late: phase, conditions, failed replicas."""
    snapshot = session.snapshot(identity)
    if snapshot is None or snapshot.status is None:
        return "no status yet"
    status = snapshot.status
    parts = [f"phase {status.phase}", f"ready {status.replicas_summary or '?'}"]
    parts += [f"{c.type}={c.status.value} {c.reason}: {c.message}" for c in status.conditions]
    parts += [
        f"{pod}: {entry.state.value} {entry.reason or ''} {entry.message or ''}"
        for pod, entry in sorted(status.replicas.items())
        if entry.state.value == "Failed"
    ]
    return "; ".join(parts)


def roll_out(
    sessions: Sequence[RegionSession],
    snapshot: PublishedSnapshot,
    settings: DemoSettings,
    say: Say,
) -> RolloutTiming:
    """Apply the PolicySnapshot everywhere; wait on its Ready condition in every region."""
    timing = RolloutTiming(snapshot)
    say(f"published {_describe(snapshot)}")
    started = time.monotonic()
    for session in sessions:
        session.apply(snapshot.manifest(DEPLOYMENT).to_k8s())
    for session in sessions:

        def ready(session: RegionSession = session) -> str | None:
            chain = session.snapshot_condition(snapshot.identity, CHAIN_VALID)
            if chain is not None and chain.status is ConditionStatus.FALSE:
                raise LocalRegionError(
                    "the snapshot's chain is broken",
                    region=session.name,
                    snapshot=snapshot.identity,
                    reason=chain.reason,
                    detail=chain.message,
                )
            condition = session.snapshot_condition(snapshot.identity, READY)
            ok = condition is not None and condition.status is ConditionStatus.TRUE
            return condition.reason if condition is not None and ok else None

        def problems(session: RegionSession = session) -> str:
            return _snapshot_problems(session, snapshot.identity)

        reason = session.wait(
            f"policysnapshot/{snapshot.identity} Ready", ready, settings.ready_timeout_s, problems
        )
        seconds = time.monotonic() - started
        timing.seconds_by_region[session.name] = seconds
        timing.reason_by_region[session.name] = reason
        ledger = session.snapshot(snapshot.identity)
        summary = ledger.status.replicas_summary if ledger and ledger.status else "?"
        say(f"  {session.name}: Ready ({reason}) {summary} replicas, verified ({seconds:.1f} s)")
    return timing


async def corrupt_one_file(storage: Storage, snapshot: PublishedSnapshot) -> str:
    """Flip one byte in the middle of the snapshot's largest stored file (not its manifest),
    as a bad disk or a broken copy would; return its key."""
    keys = [f"{snapshot.identity}/{name}" for name in snapshot.files if name != MANIFEST]
    sizes = {key: (await storage.stat(key)).size for key in keys}
    key = max(sizes, key=lambda k: sizes[k])
    data = bytearray(await storage.get(key, max_bytes=sizes[key]))
    data[len(data) // 2] ^= 0xFF
    await storage.put(key, bytes(data))
    return key


def break_and_recover(
    sessions: Sequence[RegionSession],
    trainer: PolicyTrainer,
    storage: Storage,
    settings: DemoSettings,
    say: Say,
) -> BrokenChain:
    """Publish a delta with one corrupt file; show what the operator and replicas do; let
    the next Full clear it."""
    last_good = trainer.published[-1].identity
    trainer.train_step()
    snapshot = asyncio.run(trainer.publish(full=False))
    key = asyncio.run(corrupt_one_file(storage, snapshot))
    broken = BrokenChain(snapshot, key, last_good)
    say(f"published {_describe(snapshot)}")
    say(f"  … and flipped one byte of {key} in the bucket")
    for session in sessions:
        session.apply(snapshot.manifest(DEPLOYMENT).to_k8s())
    for session in sessions:
        _observe_break(session, broken, settings, say)
    broken.answers = ask_fronts(sessions, say)
    trainer.train_step()
    full = asyncio.run(trainer.publish(full=True))
    broken.recovery = roll_out(sessions, full, settings, say)
    for session in sessions:

        def cleared(session: RegionSession = session) -> str | None:
            return _condition_is(session, ConditionStatus.FALSE)

        degraded = session.wait(
            f"{DEPLOYMENT} Degraded to clear", cleared, settings.ready_timeout_s
        )
        broken.degraded_after_recovery[session.name] = degraded
        say(f"  {session.name}: Degraded={degraded} after {full.identity}")
    return broken


def _condition_is(session: RegionSession, status: ConditionStatus) -> str | None:
    condition = session.deployment_condition(DEGRADED)
    if condition is None or condition.status is not status:
        return None
    return f"{condition.status.value} ({condition.reason})"


def _observe_break(
    session: RegionSession, broken: BrokenChain, settings: DemoSettings, say: Say
) -> None:
    identity, timeout = broken.snapshot.identity, settings.ready_timeout_s

    def chain_broken() -> str | None:
        chain = session.snapshot_condition(identity, CHAIN_VALID)
        return chain.reason if chain and chain.status is ConditionStatus.FALSE else None

    reason = session.wait(
        f"policysnapshot/{identity} ChainValid=False",
        chain_broken,
        timeout,
        explain=lambda: _snapshot_problems(session, identity),
    )
    broken.chain_reason_by_region[session.name] = reason

    def degraded() -> str | None:
        condition = session.deployment_condition(DEGRADED)
        ok = condition is not None and condition.status is ConditionStatus.TRUE
        return f"{condition.reason}: {condition.message}" if condition and ok else None

    broken.degraded_reason_by_region[session.name] = session.wait(
        f"{DEPLOYMENT} Degraded", degraded, timeout
    )

    def events() -> list[str]:
        """The deployment's Events about this break (an earlier run may have left others)."""
        found = [m for r in sorted(CHAIN_BREAKING_REASONS) for m in session.events(r)]
        return [message for message in found if identity in message]

    broken.events_by_region[session.name] = session.wait(
        "the operator's Event about the break", events, timeout
    )

    def serving_last_good() -> dict[str, str | None]:
        served = session.served()
        done = len(served) == settings.replicas
        return served if done and set(served.values()) == {broken.last_good} else {}

    broken.served_by_region[session.name] = session.wait(
        f"every replica serving {broken.last_good}",
        serving_last_good,
        timeout,
        explain=lambda: str(session.served()),
    )
    held = broken.degraded_reason_by_region[session.name]
    say(
        f"  {session.name}: policysnapshot/{identity} ChainValid=False ({reason}); "
        f"rolloutdeployment/{DEPLOYMENT} Degraded=True ({held.split(':', 1)[0]})"
    )
    say(f"  {session.name}: Event {reason}: {_short(broken.events_by_region[session.name][-1])}")
    say(f"  {session.name}: every replica still serves {broken.last_good}")


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _ask_front(port: int) -> tuple[str, str]:
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": SERVED_NAME, "prompt": "A trainer publishes", "max_tokens": 12},
        )
        response.raise_for_status()
        return response.json()["model"], response.headers.get(contract.POLICY_HEADER, "")


def ask_fronts(sessions: Sequence[RegionSession], say: Say) -> dict[str, tuple[str, str]]:
    """One completion through each region's Service: which policy answered."""
    answers: dict[str, tuple[str, str]] = {}
    for session in sessions:
        port = session.service_port()
        if port is None:
            say(f"{session.name}: no local Service port yet")
            continue
        model, policy = asyncio.run(_ask_front(port))
        answers[session.name] = (model, policy)
        say(
            f"  {session.name}: 127.0.0.1:{port} answered as model={model} "
            f"({contract.POLICY_HEADER}: {policy})"
        )
    return answers


def show_objects(session: RegionSession, say: Say) -> None:
    """What ``kubectl get rd,psnap`` shows in one region: targets, steps, READY 2/2."""
    say(f"$ kubectl --context {session.region.context} -n {session.namespace} get rd,psnap")
    say(session.kubectl("-n", session.namespace, "get", "rd,psnap").rstrip())


def show_ledger(kubeconfig: Path, sessions: Sequence[RegionSession], say: Say) -> str:
    """``hotload ledger`` over every region, as a user runs it."""
    contexts = [arg for s in sessions for arg in ("--context", s.region.context)]
    namespace = sessions[0].namespace
    command = [
        str(Path(sys.executable).parent / "hotload"),
        "ledger", "--kubeconfig", str(kubeconfig), "-n", namespace, *contexts,
    ]  # fmt: skip
    say(f"$ hotload ledger -n {namespace} {' '.join(contexts)}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise LocalRegionError("hotload ledger failed", stderr=done.stderr.strip()[-2000:])
    say(done.stdout.rstrip())
    return done.stdout


def timings_json(timings: Sequence[RolloutTiming]) -> str:
    return json.dumps(
        [
            {
                "snapshot": t.snapshot.identity,
                "kind": t.snapshot.kind.value,
                "storedBytes": t.snapshot.stored_bytes,
                "secondsByRegion": t.seconds_by_region,
                "readyReasonByRegion": t.reason_by_region,
            }
            for t in timings
        ],
        indent=2,
    )
