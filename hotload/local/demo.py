"""The main job: one trainer, three regions, each with its own bucket behind a WAN link, the
hotload chart installed with helm in each. Train for real, publish every step, watch every
replica in every region follow, break one delta, watch the fallback.

What it does, in order (each step one function, so a longer demo adds steps, not branches):

1. brings up three local regions (real etcd, kube-apiserver, kwok, the pod runtime), each
   with its own bucket (MinIO) behind an emulated WAN link (toxiproxy: latency, bandwidth,
   a byte counter), the buckets replicating to each other (MinIO's own replication);
2. installs ``charts/hotload`` into each region with the pinned ``helm`` and waits until the
   operator Deployment (two replicas, one leader Lease) is available;
3. applies a RolloutDeployment in each region that reads the region's own bucket; the
   operator renders its StatefulSet, Service and sidecar RBAC, and the pod runtime runs
   every replica's real ``hotload engine reference`` and ``hotload sidecar`` processes;
4. trains a ~6M-parameter model for real (AdamW at an RL-like learning rate) and hands every
   step's weights to the publisher (``hotload.publish``): a Full at the first step, deltas
   after it, and every 25 steps a checkpoint (a Full of that step's weights) published
   beside the chain while the deltas go on; each uploaded once into the home region's
   bucket (replication brings the others their copy); each step's snapshot is applied as a
   PolicySnapshot in every region and waited on until Ready everywhere. Per step it prints
   the snapshot's size (a delta against the full weights), the bytes that crossed the WAN
   links, publish -> Ready per region, and which policy answered a completion in every
   region;
5. stores one delta damaged (a byte flipped in its data): every region's replicas refuse it
   (checksum), the operator marks it ``ChainValid=False`` and the deployment ``Degraded``,
   emits an Event, and every replica keeps serving the last good snapshot; the publisher
   makes the next step a Full, which clears it;
6. prints, per kind, the median bytes over the WAN against the snapshot's size (once per
   region: three copies, never one per replica) and publish -> all Ready;
7. ends with ``kubectl get rd,psnap`` in one region and ``hotload ledger`` across all three
   (its LAG column: steps behind the newest snapshot published in any region).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hotload.api import SnapshotKind
from hotload.api.conditions import CHAIN_VALID, DEGRADED, ConditionStatus
from hotload.api.kinds import Identity
from hotload.api.reasons import CHAIN_BREAKING_REASONS
from hotload.errors import HotloadError, LocalRegionError
from hotload.local import replication, wan
from hotload.local.chart import ChartRelease
from hotload.local.corruption import CorruptingBucket, corrupting_opener
from hotload.local.demo_region import RegionSession
from hotload.local.fleets import FleetSpec, apply_fleet, complete
from hotload.local.lifecycle import LocalRegions
from hotload.local.region import RegionAddons, WanLink
from hotload.local.trainer import PolicyTrainer
from hotload.local.world import bring_up
from hotload.publish import (
    Publisher,
    PublisherSettings,
    PublishResult,
    RegionOutcome,
    identity_for,
)

log = logging.getLogger(__name__)

REGIONS: Final = ("us-east", "eu-west", "ap-south")
DEPLOYMENT: Final = "demo"
SERVED_NAME: Final = "policy"
PROMPT: Final = "A trainer publishes"
#: A Qwen2-style model of ~6.4M parameters (12.8 MB of bf16 weights): big enough that a
#: delta's size is set by what changed, not by its manifest.
DEMO_MODEL: Final = {
    "model_type": "qwen2",
    "vocab_size": 320,
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
Say = Callable[[str], None]


@dataclass(frozen=True)
class DemoSettings:
    regions: int = 3
    replicas: int = 2
    steps: int = 30
    """Training steps after the first snapshot (one publish each)."""
    full_every: int = 25
    corrupt_step: int | None = 27
    """The step whose delta is stored damaged (None: no break); after the cadence's
    checkpoint at 25, so the run shows both a checkpoint and the Full after a break."""
    namespace: str = "hotload-demo"
    state_dir: Path | None = None
    index_base: int = 1
    size: str = "demo"
    """``demo`` (~6.4M parameters), a reference model size, or a config.json path."""
    lr: float = 1e-6
    wan_rate_kb_s: int = 20_000
    wan_latency_ms: int = 40
    ready_timeout_s: float = 600.0
    chart: ChartRelease | None = None
    """The release installed into every region (default: the chart's defaults, the operator
    watching ``namespace`` only, with a Role there)."""

    @property
    def release(self) -> ChartRelease:
        return self.chart or ChartRelease(watch_namespaces=(self.namespace,))


@dataclass
class RolloutTiming:
    snapshot: PublishResult
    seconds_by_region: dict[str, float] = field(default_factory=dict)
    """Publish → the PolicySnapshot's Ready condition in each region."""
    reason_by_region: dict[str, str] = field(default_factory=dict)
    """Ready's reason: Rolled (it is the target) or Superseded (a newer one is)."""
    wan_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes into each region over its WAN link while this snapshot was published."""
    answers: dict[str, str] = field(default_factory=dict)
    """Region → the identity that served a completion right after."""


@dataclass
class BrokenChain:
    """What the demo saw while one delta was stored damaged."""

    snapshot: PublishResult
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
    """Every snapshot that rolled out (the damaged one is in ``broken``)."""
    broken: BrokenChain | None = None
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Region → (the ``model`` a completion named, its ``x-hotload-policy`` header)."""
    ledger: str = ""
    """What ``hotload ledger`` printed at the end."""


def run_demo(settings: DemoSettings, say: Say = print) -> DemoResult:
    """Run the whole demo and return what it observed (the e2e test asserts on it)."""
    regions = bring_up_regions(settings, say)
    sessions = [RegionSession(r, settings.namespace, DEPLOYMENT) for r in regions.regions]
    try:
        trainer = _trainer(regions, settings, sessions, say)
        spec = FleetSpec(
            name=DEPLOYMENT,
            namespace=settings.namespace,
            replicas=settings.replicas,
            served_name=SERVED_NAME,
            # The engines start with the architecture the trainer trains.
            engine_args=("--model-config", trainer.model_config),
        )
        for session in sessions:
            apply_deployment(session, spec)
        say(
            f"RolloutDeployment/{DEPLOYMENT} in {settings.namespace}: {settings.replicas} "
            "reference replicas per region, each region reading its own bucket"
        )
        result = train_and_publish(regions, sessions, spec, trainer, settings, say)
        result.answers = ask_fronts(regions, spec, say)
        show_objects(sessions[0], say)
        result.ledger = show_ledger(regions.kubeconfig, sessions, say)
    finally:
        for session in sessions:
            session.close()
    say(
        f"done. Look around: hotload status --kubeconfig {regions.kubeconfig} "
        + " ".join(f"--context {name}" for name in regions.names)
        + "\nstop with: hotload local down"
    )
    return result


def bring_up_regions(settings: DemoSettings, say: Say) -> LocalRegions:
    """The regions with their buckets and WAN links, and the chart's operator in each."""
    names = REGIONS[: settings.regions] if settings.regions <= len(REGIONS) else [
        f"region-{n}" for n in range(1, settings.regions + 1)
    ]  # fmt: skip
    addons = RegionAddons(
        object_storage=True,
        wan=WanLink(rate_kb_s=settings.wan_rate_kb_s, latency_ms=settings.wan_latency_ms),
        replication=True,
    )
    say(
        f"bringing up {len(names)} local regions ({', '.join(names)}): a real control plane, "
        f"a bucket (MinIO) behind a WAN link ({settings.wan_rate_kb_s:,} KB/s, "
        f"{settings.wan_latency_ms} ms), buckets replicating to each other …"
    )
    say(f"helm install {settings.release.release} charts/hotload into each region …")
    started = time.monotonic()
    regions = bring_up(
        names,
        addons=addons,
        state_dir=settings.state_dir,
        index_base=settings.index_base,
        chart=settings.release,
    )
    if not all(region.addons.object_storage for region in regions.regions):
        raise LocalRegionError(
            "these regions run without buckets: run `hotload local down` and the demo again",
            state_dir=str(regions.state_dir),
        )
    say(
        f"  hotload operator available in every region ({time.monotonic() - started:.0f} s): "
        f"deploy/{settings.release.operator_deployment} in {settings.release.namespace}, "
        f"{settings.release.operator_replicas} replicas, one leader Lease"
    )
    # The publisher finds each region's bucket credentials by kube context (a profile each).
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(regions.aws_credentials_file)
    os.environ["AWS_CONFIG_FILE"] = str(regions.aws_config_file)
    return regions


def apply_deployment(session: RegionSession, spec: FleetSpec) -> None:
    """The namespace, the bucket Secret and the RolloutDeployment; the operator makes the rest."""
    session.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": session.namespace}}
    )
    apply_fleet(session.region, spec)


def _trainer(
    regions: LocalRegions, settings: DemoSettings, sessions: Sequence[RegionSession], say: Say
) -> PolicyTrainer:
    """A fresh trainer whose steps continue after any snapshot an earlier run left: targets
    only move forward, so a rerun on the same regions starts above the last step."""
    run = format(int(time.time()) % 36**6, "x")
    work = regions.state_dir / "demo" / run
    size = settings.size
    if size == "demo":
        work.mkdir(parents=True, exist_ok=True)
        (work / "config.json").write_text(json.dumps(DEMO_MODEL))
        size = str(work / "config.json")
    trainer = PolicyTrainer(work / "trainer", name=f"{DEPLOYMENT}-{run}", size=size, lr=settings.lr)
    steps = [s.spec.step for session in sessions for s in session.snapshots()]
    trainer.step = max(steps) + 1 if steps else 0
    params = sum(p.numel() for p in trainer.model.parameters())
    say(f"trainer: {params / 1e6:.1f}M parameters, AdamW at lr {settings.lr:g} (RL-like)")
    return trainer


def train_and_publish(
    regions: LocalRegions,
    sessions: Sequence[RegionSession],
    spec: FleetSpec,
    trainer: PolicyTrainer,
    settings: DemoSettings,
    say: Say,
) -> DemoResult:
    """Train and publish every step; break one delta on the way."""
    names = regions.names
    prefix = f"{DEPLOYMENT}-{trainer.name.rsplit('-', 1)[-1]}"
    first = trainer.step
    corrupt = None if settings.corrupt_step is None else first + settings.corrupt_step
    damaged = {identity_for(prefix, corrupt, SnapshotKind.INCREMENTAL)} if corrupt else set()
    opener, buckets = corrupting_opener(damaged)
    publisher_settings = PublisherSettings(
        deployment=DEPLOYMENT,
        contexts=tuple(names),
        workdir=trainer.workdir.parent / "publisher",
        namespace=settings.namespace,
        kubeconfig=regions.kubeconfig,
        identity_prefix=prefix,
        home=names[0],
        full_every=settings.full_every,
        wait=True,
        wait_timeout_s=settings.ready_timeout_s,
        # The demo shows the operator's side of a break before the next step's Full.
        fallback_full=False,
        files_from=trainer.model_files(trainer.workdir.parent / "model"),
    )
    result = DemoResult()
    say(
        f"publishing every step to {len(names)} regions: written once into {names[0]}'s bucket, "
        "replicated to the others, applied everywhere, waited on until Ready"
    )
    with Publisher(publisher_settings, open_bucket=opener) as publisher:
        for number in range(settings.steps + 1):
            if number:
                trainer.train_step()
            if trainer.step == corrupt:
                say(f"(step {trainer.step}'s delta goes into the bucket with one byte flipped …)")
            timing = publish_step(regions, spec, publisher, trainer, settings)
            published = timing.snapshot
            if trainer.step == corrupt and result.timings:
                result.broken = observe_break(
                    sessions, timing, buckets, result.timings[-1], settings, say
                )
                continue
            result.timings.append(timing)
            say_step(timing, names, say)
            if result.broken is not None and result.broken.recovery is None:
                result.broken.recovery = timing
                wait_cleared(sessions, result.broken, published, settings, say)
    say_totals(result.timings, len(names), say)
    return result


def publish_step(
    regions: LocalRegions,
    spec: FleetSpec,
    publisher: Publisher,
    trainer: PolicyTrainer,
    settings: DemoSettings,
) -> RolloutTiming:
    """One publish, waited on everywhere; the bytes each WAN link carried meanwhile."""
    before = {region.name: wan.bytes_over(region) for region in regions.regions}
    # Settling closed the links a moment: replication must flow again before the write.
    replication.wait_flowing(regions.region(regions.names[0]), regions.regions)  # the home
    published = publisher.publish(trainer.inference_state(), trainer.step).result()
    after = {region.name: wan.bytes_over(region) for region in regions.regions}
    timing = RolloutTiming(
        published, wan_bytes={n: after[n].inbound - before[n].inbound for n in regions.names}
    )
    for name, outcome in published.regions.items():
        if outcome.outcome.ok and outcome.ready_seconds is not None:
            timing.seconds_by_region[name] = outcome.ready_seconds
            timing.reason_by_region[name] = (
                "Superseded" if outcome.outcome is RegionOutcome.SUPERSEDED else "Rolled"
            )
        elif outcome.outcome is not RegionOutcome.CHAIN_BROKEN:
            raise LocalRegionError(
                "a region did not roll the snapshot out",
                region=name,
                snapshot=published.identity,
                outcome=outcome.outcome.value,
                error=outcome.error or "",
            )
    for region in regions.regions:
        try:
            timing.answers[region.name] = complete(region, spec, PROMPT).identity
        except HotloadError as err:
            timing.answers[region.name] = f"(no answer: {err.message})"
    return timing


def _kib(count: float) -> str:
    return f"{count / 1024:,.1f} KiB" if count < 4 * 1024 * 1024 else f"{count / 2**20:,.1f} MiB"


def say_step(timing: RolloutTiming, names: Sequence[str], say: Say) -> None:
    snapshot = timing.snapshot
    size = f"{snapshot.kind.value:<11} {_kib(snapshot.stored_bytes):>10}"
    if snapshot.kind is SnapshotKind.INCREMENTAL:
        size += f" ({snapshot.ratio:.0f}x smaller than the full weights)"
    elif snapshot.why == "chain-broken":
        size += " (the Full after the break)"
    if snapshot.checkpoint_begun:
        size += f"; a checkpoint of it goes out beside the chain ({snapshot.checkpoint_begun})"
    for ended in (d for d in snapshot.checkpoint_done if d.complete):
        size += f"; checkpoint {ended.identity} is in every bucket"
        size += (
            ", named from this delta on (new replicas start from it)"
            if snapshot.checkpoint == ended.identity
            else ", named by no delta (this snapshot starts a new chain)"
        )
    crossed = sum(timing.wan_bytes.values())
    ready = "  ".join(f"{n} {timing.seconds_by_region.get(n, 0):.1f}s" for n in names)
    say(f"step {snapshot.step:>3}: {size}; over the WAN {_kib(crossed)}; Ready: {ready}")
    answered = {timing.answers.get(n) for n in names}
    served = (
        f"all {len(names)} regions answer as {snapshot.identity}"
        if answered == {snapshot.identity}
        else "answers: " + ", ".join(f"{n}={timing.answers.get(n)}" for n in names)
    )
    say(f"          {served}")


def say_totals(timings: Sequence[RolloutTiming], regions: int, say: Say) -> None:
    """Bytes over the WAN per snapshot, Full vs delta, against the snapshot's size."""
    for kind in (SnapshotKind.FULL, SnapshotKind.INCREMENTAL):
        picked = [t for t in timings if t.snapshot.kind is kind]
        if not picked:
            continue
        crossed = statistics.median(sum(t.wan_bytes.values()) for t in picked)
        stored = statistics.median(t.snapshot.stored_bytes for t in picked)
        slowest = statistics.median(max(t.seconds_by_region.values(), default=0) for t in picked)
        say(
            f"{kind.value}: median {_kib(stored)} stored, {_kib(crossed)} over the WAN "
            f"({crossed / stored:.2f}x: once per region, {regions} regions), publish -> all "
            f"Ready {slowest:.1f} s"
        )


def _snapshot_problems(session: RegionSession, identity: Identity) -> str:
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


def observe_break(
    sessions: Sequence[RegionSession],
    timing: RolloutTiming,
    buckets: Sequence[CorruptingBucket],
    last_good: RolloutTiming,
    settings: DemoSettings,
    say: Say,
) -> BrokenChain:
    """What the operator and the replicas do with the damaged delta, in every region."""
    snapshot = timing.snapshot
    keys = [key for bucket in buckets for key in bucket.damaged]
    broken = BrokenChain(snapshot, keys[0] if keys else "", last_good.snapshot.identity)
    say(
        f"step {snapshot.step:>3}: {snapshot.identity} ({_kib(snapshot.stored_bytes)}), "
        f"flipped one byte of {broken.corrupted_key or '?'}: every region answered "
        + ", ".join(f"{n} {r.outcome.value}" for n, r in snapshot.regions.items())
    )
    for session in sessions:
        _observe_break(session, broken, settings, say)
    broken.answers = {
        name: (f"{SERVED_NAME}@{identity}", identity) for name, identity in timing.answers.items()
    }
    say(
        "  completions still name "
        + ", ".join(f"{name}: {identity}" for name, identity in timing.answers.items())
    )
    say("  the publisher makes the next step a Full (its rule after a region reports a break)")
    return broken


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
        f"  {session.name}: ChainValid=False ({reason}), rolloutdeployment/{DEPLOYMENT} "
        f"Degraded=True ({held.split(':', 1)[0]}), Event {reason}: "
        f"{_short(broken.events_by_region[session.name][-1], 60)}; every replica still "
        f"serves {broken.last_good}"
    )


def wait_cleared(
    sessions: Sequence[RegionSession],
    broken: BrokenChain,
    full: PublishResult,
    settings: DemoSettings,
    say: Say,
) -> None:
    """The Full after the break clears Degraded everywhere."""
    for session in sessions:

        def cleared(session: RegionSession = session) -> str | None:
            condition = session.deployment_condition(DEGRADED)
            if condition is None or condition.status is not ConditionStatus.FALSE:
                return None
            return f"{condition.status.value} ({condition.reason})"

        degraded = session.wait(
            f"{DEPLOYMENT} Degraded to clear", cleared, settings.ready_timeout_s
        )
        broken.degraded_after_recovery[session.name] = degraded
    say(
        f"          {full.identity} cleared the break: Degraded="
        + ", ".join(f"{n} {v}" for n, v in broken.degraded_after_recovery.items())
    )


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ask_fronts(regions: LocalRegions, spec: FleetSpec, say: Say) -> dict[str, tuple[str, str]]:
    """One completion through each region's Service: which policy answered."""
    answers: dict[str, tuple[str, str]] = {}
    for region in regions.regions:
        answer = complete(region, spec, PROMPT, max_tokens=12)
        answers[region.name] = (answer.model, answer.policy)
        say(f"  {region.name} answered as model={answer.model} (x-hotload-policy: {answer.policy})")
    return answers


def show_objects(session: RegionSession, say: Say) -> None:
    """What ``kubectl get rd,psnap`` shows in one region: targets, steps, READY 2/2."""
    say(f"$ kubectl --context {session.region.context} -n {session.namespace} get rd,psnap")
    lines = session.kubectl("-n", session.namespace, "get", "rd,psnap").rstrip().splitlines()
    # Thirty-odd snapshots: the header, and the newest few.
    say("\n".join(lines if len(lines) <= 12 else [*lines[:4], "…", *lines[-6:]]))


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
                "wanBytesByRegion": t.wan_bytes,
                "secondsByRegion": t.seconds_by_region,
                "readyReasonByRegion": t.reason_by_region,
                "servedByRegion": t.answers,
            }
            for t in timings
        ],
        indent=2,
    )
