"""The sidecar's side of a coordinated switch on real replicas (reference engine pods run by
the pod runtime): the test writes ``status.targetSnapshot`` as the operator would — the
target alone while the publisher waits, then with the committed ``switchAt`` (or only the
deadline ``switchBy``, the publisher gone).

Would catch: a replica swapping before a switch time exists (switching alone), a replica
never saying Staged (the publisher would never commit), the engines swapping at their own
pace instead of at the instant (read from each engine's own swap log, not the sidecar's
intent), a replica waiting forever when only the deadline is known, a sidecar killed after
Staged that never switches or does not say Late, or an engine swapping with its sidecar
down.
"""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hotload.api import GROUP, VERSION, SnapshotRef
from hotload.api.pod import ANNOTATION_SWITCH
from hotload.api.rollout_deployment import PLURAL
from hotload.api.switch import parse_switch_time, switch_time
from tests.fixtures.trainer import Trainer
from tests.integration.sidecar.harness import (
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NAME = "sw"
REPLICAS = 3
#: The engines' own switch instants must fall within this of the switch time (issue 24's
#: goal is 100 ms on this machine's one clock; a loaded CI machine gets some slack).
SPREAD_S = 0.25


async def _all_staged(harness: SidecarHarness, replicas: list[Replica], identity: str) -> None:
    for replica in replicas:
        notes = await harness.wait_state(replica, identity, "Loading", timeout=180)
        try:
            await eventually(
                lambda r=replica: harness.annotations(r.pod).get(ANNOTATION_SWITCH) == "Staged",
                timeout=120,
                what=f"{replica.pod} Staged for {identity}",
            )
        except AssertionError as err:
            engine = await harness.engine_identity(replica)
            raise AssertionError(
                f"{err}\n{harness.annotations(replica.pod)}\n{engine}\n--- sidecar log ---\n"
                f"{harness.log(replica, 'sidecar', tail=12000)}"
            ) from None
        assert notes["hotload.dev/snapshot"] != identity


async def _switched(
    harness: SidecarHarness, replicas: list[Replica], identity: str
) -> list[dict[str, Any]]:
    """Each engine's own record of its swap to ``identity``, once every pod is Ready."""
    records = []
    for replica in replicas:
        await harness.wait_state(replica, identity, "Ready", timeout=120)
        log = (await harness.engine_identity(replica))["swap_log"]
        records.append(next(r for r in reversed(log) if r["identity"] == identity))
    return records


def _within(instants: list[datetime], at: datetime) -> bool:
    return all(at <= moment < at + timedelta(seconds=SPREAD_S) for moment in instants)


def _instant_in(*, seconds: float) -> datetime:
    """A moment ``seconds`` from now as the status carries it: to the millisecond,
    truncated. The engines swap at the instant written, so the test compares with that one
    (compared with the unwritten microseconds, a swap 0.1 ms after the written instant read
    as early)."""
    moment = parse_switch_time(switch_time(datetime.now(UTC) + timedelta(seconds=seconds)))
    assert moment is not None
    return moment


def _with(ref: SnapshotRef, **switch: datetime) -> SnapshotRef:
    return ref.model_copy(update=switch)


def _target(harness: SidecarHarness, ref: SnapshotRef) -> None:
    """Write the target whole, as the operator does: a switch field it lacks is nulled (a
    merge patch would keep the last target's)."""
    cleared: dict[str, Any] = {"switchAt": None, "switchBy": None}
    harness.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, harness.namespace, PLURAL, NAME,
        {"status": {"targetSnapshot": {**cleared, **ref.to_k8s()}}},
    )  # fmt: skip


async def test_every_replica_swaps_at_the_committed_instant_and_none_alone(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    body = rollout_deployment(NAME, bucket_url)
    body["spec"]["rollout"] = {"switch": "Coordinated"}
    body["spec"]["replicas"] = REPLICAS
    harness.create_deployment(body)
    replicas = list(
        await asyncio.gather(*(harness.replica(f"{NAME}-{i}", NAME) for i in range(REPLICAS)))
    )
    # Nothing served yet: the first snapshot loads at once (no policy to stay on).
    full = await trainer.publish_full()
    _target(harness, full.ref())
    for replica in replicas:
        await harness.wait_state(replica, full.identity, "Ready", timeout=180)

    # Staged, and nobody moves while no time is known.
    trainer.train_step()
    first = await trainer.publish_delta()
    _target(harness, first.ref())
    await _all_staged(harness, replicas, first.identity)
    await asyncio.sleep(1.0)
    for replica in replicas:
        engine = await harness.engine_identity(replica)
        assert (engine["identity"], engine["staged"]) == (full.identity, first.identity)

    # The commit: every engine swaps at the instant, by its own account.
    at = _instant_in(seconds=4)
    _target(harness, _with(first.ref(), switch_at=at))
    records = await _switched(harness, replicas, first.identity)
    instants = [datetime.fromtimestamp(r["at"], UTC) for r in records]
    assert all(r["how"] == "switch" for r in records), records
    assert all(at <= moment < at + timedelta(seconds=SPREAD_S) for moment in instants), (
        at,
        instants,
    )
    spread_ms = (max(instants) - min(instants)).total_seconds() * 1000
    print(f"coordinated switch: {REPLICAS} replicas, spread {spread_ms:.1f} ms")
    for replica in replicas:
        assert harness.annotations(replica.pod)[ANNOTATION_SWITCH] == "OnTime"

    # The publisher died before committing (Follow): the deadline alone is the time.
    trainer.train_step()
    second = await trainer.publish_delta()
    _target(harness, second.ref())
    await _all_staged(harness, replicas, second.identity)
    # A sidecar that crashes after Staged: it is down when the time comes (frozen, so that
    # a quick restart cannot bring it back in time: the runtime restarts a killed sidecar
    # in well under the 3 s to the deadline), dies after it, and follows, Late.
    crashed = replicas[-1]
    frozen = harness.freeze(crashed, "sidecar")
    by = _instant_in(seconds=3)
    _target(harness, _with(second.ref(), switch_by=by))
    records = await _switched(harness, replicas[:-1], second.identity)
    instants = [datetime.fromtimestamp(r["at"], UTC) for r in records]
    assert all(by <= moment < by + timedelta(seconds=SPREAD_S) for moment in instants), (
        by,
        instants,
    )
    engine = await harness.engine_identity(crashed)
    assert (engine["identity"], engine["staged"]) == (first.identity, second.identity), (
        "the engine swapped with its sidecar down"
    )
    os.kill(frozen, signal.SIGKILL)
    await harness.wait_restarted(crashed, 1)
    late = (await _switched(harness, [crashed], second.identity))[0]
    assert datetime.fromtimestamp(late["at"], UTC) >= by
    await eventually(
        lambda: harness.annotations(crashed.pod).get(ANNOTATION_SWITCH) == "Late",
        timeout=30,
        what=f"the crashed replica to say Late ({harness.annotations(crashed.pod)})",
    )
