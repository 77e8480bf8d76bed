"""The coordinated switch through the whole chain, three regions (issue 24).

A real publisher, as a trainer runs it (in process, and the ``hotload publish`` command in
a subprocess), publishes to three local regions, each with its bucket behind a WAN link and
the chart's operator (the package's fixtures); per region one RolloutDeployment with
``spec.rollout.switch: Coordinated`` and two replicas (sidecar + reference engine), reused
by every scenario in turn. When each engine switched is read from the engine's own
``swap_log`` (``/admin/identity``), never from the sidecars' reports. The scenarios run in
the file's order, each from "every replica serves the last snapshot":

1. everyone Staged: one committed instant, every engine of every region at it;
2. a replica crashes after Staged: the others on time, it follows once back, Late;
3. a region unreachable at the decision: the others at the committed time (the deadline),
   it follows once back, Late;
4. the publisher killed between staging and commit: everyone at the deadline (switchBy).

docs/operator.md ("Coordinated switch") is the protocol these check.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import pytest
from kubernetes import client as k8s

from hotload.api import GROUP, VERSION, SnapshotKind
from hotload.api.labels import SWITCH_AT_ANNOTATION, SWITCH_BY_ANNOTATION
from hotload.api.pod import ANNOTATION_SWITCH
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.api.switch import SwitchDecision, parse_switch_time
from hotload.local import LocalRegions
from hotload.local.fleets import FleetSpec, apply_fleet, engine_urls, swap_record
from hotload.local.region import Region
from hotload.local.trainer import PolicyTrainer
from hotload.publish import Publisher, PublisherSettings, RegionOutcome, identity_for
from hotload.waiting import wait_until
from tests.fixtures.apiserver_outage import apiserver_down
from tests.fixtures.cluster import namespace_everywhere
from tests.fixtures.hotload_cli import command
from tests.fixtures.wan_publisher import home_publisher

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

FLEET: Final = "policy"
REPLICAS: Final = 2
STAGING_TIMEOUT_S: Final = 30
LEAD_MS: Final = 2000
ROLLOUT: Final = {
    "switch": "Coordinated",
    "stagingTimeoutSeconds": STAGING_TIMEOUT_S,
    "leadMilliseconds": LEAD_MS,
    "onStagingTimeout": "Follow",
}
#: Every engine's own switch instant must fall within this after the switch time (issue 24's
#: goal is 100 ms on this machine's one clock; a loaded CI machine gets some slack, as in
#: tests/integration/sidecar/test_sidecar_coordinated_switch.py).
SPREAD_S: Final = 0.25
WAIT_S: Final = 300

T = TypeVar("T")


@dataclass
class Chain:
    """The three regions' coordinated deployment and what every replica serves now."""

    regions: LocalRegions
    clients: dict[str, k8s.ApiClient]
    spec: FleetSpec
    trainer: PolicyTrainer
    settings: PublisherSettings
    workdir: Path
    served: str
    engines: dict[str, dict[str, str]] = field(default_factory=dict)
    """Region → pod → its engine's URL (pods keep their address: engines restart in place)."""

    @property
    def names(self) -> list[str]:
        return list(self.regions.names)

    def pods(self, region: str) -> dict[str, dict[str, Any]]:
        """Pod → its annotations."""
        listed = k8s.CoreV1Api(self.clients[region]).list_namespaced_pod(self.spec.namespace)
        return {
            str(p.metadata.name): dict(p.metadata.annotations or {})
            for p in listed.items
            if p.metadata is not None
        }

    def snapshot(self, region: str, identity: str) -> dict[str, Any] | None:
        try:
            raw = k8s.CustomObjectsApi(self.clients[region]).get_namespaced_custom_object(
                GROUP, VERSION, self.spec.namespace, SNAPSHOTS, identity
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        return cast(dict[str, Any], raw)

    def annotations(self, region: str, identity: str) -> dict[str, str]:
        """The snapshot's annotations in ``region`` (none when it is not there)."""
        raw = self.snapshot(region, identity) or {}
        return dict((raw.get("metadata") or {}).get("annotations") or {})

    def swaps(self, identity: str, regions: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """``region/pod`` → the engine's record of its swap to ``identity``, once every
        engine of ``regions`` (default: all) has one; empty before."""
        records = {}
        for region in regions or self.names:
            for pod, url in self.engines[region].items():
                record = swap_record(url, identity)
                if record is None:
                    return {}
                records[f"{region}/{pod}"] = record
        return records

    def swapped_any(self, identity: str) -> list[str]:
        """The engines (``region/pod``) that swapped to ``identity`` already."""
        return [
            f"{region}/{pod}"
            for region, pods in self.engines.items()
            for pod, url in pods.items()
            if swap_record(url, identity) is not None
        ]


def waited(probe: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """``probe``'s first truthy value; fails naming ``what`` (and the last value) if none
    came in ``timeout_s``."""
    last = wait_until(probe, timeout_s, interval_s=interval_s)
    assert last, f"timed out after {timeout_s}s waiting for {what} (last: {last!r})"
    return last


def within_spread(records: dict[str, dict[str, Any]], at: datetime, what: str) -> float:
    """Every engine swapped at ``at`` (not before, within SPREAD_S after); prints and
    returns the spread of their instants (ms)."""
    instants = {key: datetime.fromtimestamp(r["at"], UTC) for key, r in records.items()}
    off = {k: round((m - at).total_seconds() * 1000, 1) for k, m in instants.items()}
    assert all(timedelta(0) <= m - at < timedelta(seconds=SPREAD_S) for m in instants.values()), (
        f"{what}: ms after the switch time {at.isoformat()}: {off}"
    )
    spread_ms = (max(instants.values()) - min(instants.values())).total_seconds() * 1000
    print(f"{what}: {len(records)} engines, spread {spread_ms:.1f} ms, after the time: {off}")
    return spread_ms


def ledger_phases(chain: Chain, identity: str) -> dict[str, str | None]:
    """``region/pod`` → the phase the region's ledger (the snapshot's status) records."""
    phases = {}
    for region in chain.names:
        raw = chain.snapshot(region, identity) or {}
        for pod, entry in ((raw.get("status") or {}).get("replicas") or {}).items():
            phases[f"{region}/{pod}"] = entry.get("phase")
    return phases


def staged_everywhere(chain: Chain, regions: list[str] | None = None) -> bool:
    return all(
        len(pods) == REPLICAS and all(n.get(ANNOTATION_SWITCH) == "Staged" for n in pods.values())
        for pods in (chain.pods(region) for region in regions or chain.names)
    )


def all_but(chain: Chain, identity: str, left_out: str) -> dict[str, dict[str, Any]]:
    """The swap records to ``identity`` of every engine but ``left_out``, once each has one."""
    records = {}
    for region, pods in chain.engines.items():
        for pod, url in pods.items():
            if f"{region}/{pod}" == left_out:
                continue
            record = swap_record(url, identity)
            if record is None:
                return {}
            records[f"{region}/{pod}"] = record
    return records


def all_running(region: Region, namespace: str) -> dict[str, str]:
    """Every replica's engine URL in ``region``, once all are running; empty before."""
    urls = engine_urls(region, namespace)
    return urls if len(urls) == REPLICAS else {}


def sidecar_pid(chain: Chain, region: str, pod: str) -> int:
    """The pid of the pod's sidecar process (locally, the container id ``hotload://PID``)."""
    body = k8s.CoreV1Api(chain.clients[region]).read_namespaced_pod(pod, chain.spec.namespace)
    for status in (body.status.container_statuses if body.status else None) or []:
        if (
            status.name == "sidecar"
            and status.container_id
            and status.state
            and status.state.running
        ):
            return int(status.container_id.rsplit("/", 1)[-1])
    raise AssertionError(f"{region}/{pod} has no running sidecar")


def coordinate(chain_clients: dict[str, k8s.ApiClient], spec: FleetSpec) -> None:
    """``spec.rollout``: Coordinated, the same in every region."""
    for api in chain_clients.values():
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, spec.namespace, DEPLOYMENTS, spec.name, {"spec": {"rollout": ROLLOUT}}
        )


@pytest.fixture(scope="module")
def chain(
    wan_regions: LocalRegions,
    wan_clients: dict[str, k8s.ApiClient],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Chain]:
    """Per region one coordinated deployment of two replicas, every one serving a Full."""
    tmp = tmp_path_factory.mktemp("switch-chain")
    namespace = f"hl-switch-chain-{secrets.token_hex(3)}"
    with pytest.MonkeyPatch.context() as env, namespace_everywhere(namespace, wan_clients):
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(wan_regions.aws_credentials_file))
        env.setenv("AWS_CONFIG_FILE", str(wan_regions.aws_config_file))
        spec = FleetSpec(name=FLEET, namespace=namespace, replicas=REPLICAS)
        for region in wan_regions.regions:
            apply_fleet(region, spec)
        coordinate(wan_clients, spec)
        trainer = PolicyTrainer(tmp / "trainer", name="switch", size="tiny", lr=1e-6)
        settings = home_publisher(
            wan_regions, namespace, tmp, trainer, f"sw-{secrets.token_hex(3)}",
            wait_timeout_s=WAIT_S, unreachable_after_s=10, full_every=1000,
        )  # fmt: skip
        with Publisher(settings) as publisher:
            full = publisher.publish(trainer.inference_state(), trainer.step).result(timeout=600)
        # Nothing was served before: every replica loads the first snapshot at once.
        assert {r.outcome for r in full.regions.values()} == {RegionOutcome.READY}, full
        chain = Chain(wan_regions, wan_clients, spec, trainer, settings, tmp, full.identity)
        for region in wan_regions.regions:
            chain.engines[region.name] = waited(
                functools.partial(all_running, region, namespace),
                60,
                f"{REPLICAS} running pods in {region.name}",
            )
        waited(lambda: chain.swaps(full.identity), 60, "every engine serving the Full")
        yield chain


def test_every_replica_of_every_region_switches_at_the_one_committed_instant(chain: Chain) -> None:
    """The trainer's publisher, the chart's operators and the sidecars together: every
    replica Staged, one time committed, every engine of every region swaps at it.

    Would catch: a commit before every replica is Staged (an engine swapping before the
    committed time: switching alone), regions given different times, the commit not
    reaching a region's target (its engines late or never), a sidecar swapping at its own
    pace instead of at the instant, the ledger not saying OnTime."""
    chain.trainer.train_step()
    with Publisher(chain.settings) as publisher:
        result = publisher.publish(chain.trainer.inference_state(), chain.trainer.step).result(
            timeout=600
        )
    assert {r.outcome for r in result.regions.values()} == {RegionOutcome.READY}, result
    switch = result.switch
    assert switch is not None and switch.decision is SwitchDecision.COMMITTED, switch
    assert switch.all_staged and switch.undelivered == [], switch
    assert switch.staged == dict.fromkeys(chain.names, f"{REPLICAS}/{REPLICAS}"), switch
    at = parse_switch_time(switch.at)
    assert at is not None
    for region in chain.names:
        assert chain.annotations(region, result.identity)[SWITCH_AT_ANNOTATION] == switch.at
    records = waited(lambda: chain.swaps(result.identity), 60, "every engine's swap")
    assert {r["how"] for r in records.values()} == {"switch"}, records
    within_spread(records, at, "committed switch")
    every = {f"{region}/{pod}": "OnTime" for region, pods in chain.engines.items() for pod in pods}
    assert len(every) == len(chain.names) * REPLICAS
    waited(lambda: ledger_phases(chain, result.identity) == every, 60, f"the ledger: {every}")
    chain.served = result.identity


def test_a_replica_crashing_after_staged_follows_late_and_the_others_switch_on_time(
    chain: Chain,
) -> None:
    """One replica's sidecar stops (frozen) right after it says Staged and is killed once the
    others switched; the runtime restarts it.

    Would catch: the others held back by the crashed one (its pod still says Staged, so
    the commit counts it), the crashed replica never switching after its restart (waiting
    forever for a time that has passed) or switching on its own before the commit, or the
    ledger not saying Late for it and OnTime for the others."""
    crashed_region = chain.names[1]
    crashed_pod = sorted(chain.engines[crashed_region])[-1]
    crashed = f"{crashed_region}/{crashed_pod}"
    chain.trainer.train_step()
    identity = identity_for(chain.settings.prefix, chain.trainer.step, SnapshotKind.INCREMENTAL)
    with Publisher(chain.settings) as publisher:
        handle = publisher.publish(chain.trainer.inference_state(), chain.trainer.step)
        waited(
            lambda: chain.pods(crashed_region)[crashed_pod].get(ANNOTATION_SWITCH) == "Staged",
            WAIT_S,
            f"{crashed} Staged",
            interval_s=0.05,
        )
        pid = sidecar_pid(chain, crashed_region, crashed_pod)
        os.kill(pid, signal.SIGSTOP)  # hung: no longer there to hand its engine the time
        try:
            others = waited(lambda: all_but(chain, identity, crashed), WAIT_S, "the others' swaps")
            # The crashed replica did not move: its engine still serves the old snapshot.
            assert crashed not in chain.swapped_any(identity), "it switched, hung"
        finally:
            os.kill(pid, signal.SIGKILL)
        result = handle.result(timeout=600)
    assert {r.outcome for r in result.regions.values()} == {RegionOutcome.READY}, result
    switch = result.switch
    assert switch is not None and switch.decision is SwitchDecision.COMMITTED, switch
    assert switch.all_staged, switch
    at = parse_switch_time(switch.at)
    assert at is not None
    within_spread(others, at, "on time beside a crashed replica")
    late = waited(lambda: chain.swaps(identity), 120, f"{crashed}'s swap")[crashed]
    assert datetime.fromtimestamp(late["at"], UTC) >= at + timedelta(seconds=SPREAD_S), late
    print(f"crashed replica swapped {late['at'] - at.timestamp():.2f} s after the time")
    expected = {key: "OnTime" for key in others} | {crashed: "Late"}
    waited(lambda: ledger_phases(chain, identity) == expected, 60, f"the ledger: {expected}")
    raw = chain.snapshot(crashed_region, identity)
    record = ((raw or {}).get("status") or {}).get("switch") or {}
    assert record.get("lateReplicas") == 1, record
    chain.served = identity


def test_a_region_unreachable_at_the_decision_presumes_it_and_follows_once_back(
    chain: Chain,
) -> None:
    """The third region's apiserver is down from before the publish until after the
    decision: its replicas never get the snapshot while it is down.

    Would catch: the publisher deciding without the unreachable region (leaving it out of
    the coordinated regions: the others committed at once while it stays undecided, and
    with Abort it would abort alone), a decision not queued for it, the others not
    switching at the committed time (the deadline, the rule the region presumes), its
    replicas switching before the decision reaches them or never once it is back."""
    down = chain.regions.regions[2]
    up = chain.names[:2]
    chain.trainer.train_step()
    step = chain.trainer.step
    identity = identity_for(chain.settings.prefix, step, SnapshotKind.INCREMENTAL)
    with Publisher(chain.settings) as publisher:
        with apiserver_down(down):
            result = publisher.publish(chain.trainer.inference_state(), step).result(timeout=600)
            assert result.regions[down.name].outcome is RegionOutcome.PENDING, result
            for name in up:
                assert result.regions[name].outcome is RegionOutcome.READY, result
            switch = result.switch
            assert switch is not None and switch.decision is SwitchDecision.COMMITTED, switch
            # The unreachable region counted as not Staged: the staging timeout decided,
            # at the deadline, and the decision waits in the publisher's queue for it.
            assert not switch.all_staged and switch.at == switch.deadline, switch
            assert switch.undelivered == [down.name] and switch.staged[down.name] == "?", switch
            at = parse_switch_time(switch.at)
            assert at is not None
            records = waited(lambda: chain.swaps(identity, up), 60, "the reachable engines' swap")
            within_spread(records, at, "two regions, the third unreachable")
            assert not chain.swaps(identity, [down.name]), "the unreachable region switched alone"
            assert not any(r.startswith(down.name) for r in chain.swapped_any(identity))
        assert publisher.flush(timeout_s=120) == {}
    back = waited(lambda: chain.swaps(identity, [down.name]), WAIT_S, f"{down.name}'s swap")
    for key, record in back.items():
        assert datetime.fromtimestamp(record["at"], UTC) > at, (key, record, at)
    lags = {key: round(record["at"] - at.timestamp(), 2) for key, record in back.items()}
    print(f"the region that was down followed, s after the time: {lags}")
    notes = chain.annotations(down.name, identity)
    assert notes[SWITCH_AT_ANNOTATION] == switch.at, notes
    expected = {f"{down.name}/{pod}": "Late" for pod in chain.engines[down.name]}
    waited(
        lambda: (
            {k: v for k, v in ledger_phases(chain, identity).items() if k in expected} == expected
        ),
        60,
        f"the ledger of {down.name}: {expected}",
    )
    chain.served = identity


def test_a_publisher_killed_between_staging_and_commit_leaves_everyone_switching_at_the_deadline(
    chain: Chain,
) -> None:
    """``hotload publish`` in a subprocess, frozen once the snapshot is in every region and
    SIGKILLed once every replica is Staged: no decision is ever written.

    Would catch: a replica switching without a decision before the deadline (alone), or
    waiting forever for a commit that never comes (the operators' presumption of Follow at
    ``hotload.dev/switch-by`` and the sidecars' own ``switchBy``), regions presuming
    different instants."""
    chain.trainer.train_step()
    step = chain.trainer.step
    prefix = f"cli-{secrets.token_hex(2)}"
    identity = identity_for(prefix, step, SnapshotKind.FULL)  # a fresh workdir: a Full
    contexts = [part for region in chain.regions.regions for part in ("--context", region.context)]
    args = ["publish", str(chain.trainer.model_files(chain.workdir / f"m{step}")),
            "--step", str(step), "-d", FLEET, "-n", chain.spec.namespace, "--prefix", prefix,
            "--home", chain.regions.regions[0].context, "--workdir", str(chain.workdir / "cli"),
            "--wait", "--timeout", str(WAIT_S), *contexts]  # fmt: skip
    log = chain.workdir / "cli-publisher.log"
    with log.open("w") as out:
        publisher = subprocess.Popen(
            command(*args, kubeconfig=chain.regions.kubeconfig),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
        )
    try:
        waited(
            lambda: (
                all(chain.snapshot(r, identity) for r in chain.names)
                or publisher.poll() is not None
            ),
            WAIT_S,
            "the snapshot in every region",
            interval_s=0.05,
        )
        publisher.send_signal(signal.SIGSTOP)
        assert publisher.poll() is None, log.read_text()
        notes = {r: chain.annotations(r, identity) for r in chain.names}
        assert all(SWITCH_AT_ANNOTATION not in n for n in notes.values()), notes
        deadlines = {n[SWITCH_BY_ANNOTATION] for n in notes.values()}
        assert len(deadlines) == 1, notes
        deadline = parse_switch_time(deadlines.pop())
        assert deadline is not None
        waited(lambda: staged_everywhere(chain), WAIT_S, "every replica Staged")
    finally:
        publisher.kill()
        publisher.wait(timeout=30)
    assert datetime.now(UTC) < deadline, "staging outlasted the deadline: nothing tested"
    for region in chain.names:
        assert SWITCH_AT_ANNOTATION not in chain.annotations(region, identity), region
    assert chain.swapped_any(identity) == [], "a replica switched with no decision"
    records = waited(
        lambda: chain.swaps(identity),
        (deadline - datetime.now(UTC)).total_seconds() + 60,
        "every engine's swap at the deadline",
    )
    within_spread(records, deadline, "the publisher gone: at the deadline")

    def presumed() -> bool:
        return all(
            ((chain.snapshot(r, identity) or {}).get("status") or {})
            .get("switch", {})
            .get("decision")
            == SwitchDecision.PRESUMED.value
            for r in chain.names
        )

    waited(presumed, 60, "every region's record: Presumed")
    chain.served = identity
