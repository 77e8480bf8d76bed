"""A replica follows its deployment's target: a Full, then deltas, bit for bit."""

from __future__ import annotations

import json

import httpx
import pytest

from hotload.api import SnapshotKind
from tests.fixtures.trainer import PROBE_TOKENS, Trainer
from tests.integration.sidecar.harness import SidecarHarness, eventually, rollout_deployment

pytestmark = pytest.mark.cluster


async def test_full_then_five_deltas_reach_the_replica_bit_exact(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str
) -> None:
    harness.create_deployment(rollout_deployment("chain", bucket_url))
    replica = await harness.replica("chain-0", "chain")
    published = [await trainer.publish_full()]
    for _ in range(5):
        trainer.train_step()
        published.append(await trainer.publish_delta())

    for index, snapshot in enumerate(published):
        harness.set_target("chain", snapshot.ref())
        annotations = await harness.wait_state(replica, snapshot.identity, "Ready")
        assert annotations["hotload.dev/snapshot"] == snapshot.identity
        assert annotations["hotload.dev/via"] == ("full" if index == 0 else "delta")

        response = await harness.complete(replica)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == f"chain@{snapshot.identity}"
        assert response.headers["x-hotload-policy"] == snapshot.identity

        served = await harness.engine_logits(replica, PROBE_TOKENS)
        assert served["identity"] == snapshot.identity
        assert served["sha256"] == trainer.expected_logits(snapshot).sha256

    # The condition is a patch of its own, after the annotations'.
    gate = await eventually(
        lambda: (g := harness.gate("chain-0")) is not None and g.status == "True" and g,
        timeout=30,
        what="the gate to say True",
    )
    assert gate.reason == "Verified"
    status = await harness.status(replica)
    assert status["current"]["identity"] == published[-1].identity
    assert [h["identity"] for h in status["history"][:6]] == [
        p.identity for p in reversed(published)
    ]
    first = status["history"][-1]
    assert set(first["seconds"]) >= {"fetch", "verify", "rebuild", "swap"}
    assert published[0].kind is SnapshotKind.FULL
    async with httpx.AsyncClient(trust_env=False) as client:
        metrics = (await client.get(f"{replica.front}/metrics", timeout=10)).text
    last = published[-1]
    assert (
        f'hotload_snapshot_info{{identity="{last.identity}",kind="Incremental",step="5"}} 1.0'
        in (metrics)
    )
    assert 'hotload_swaps_total{via="delta"} 5.0' in metrics
    assert 'hotload_swaps_total{via="full"} 1.0' in metrics
    assert 'hotload_phase_seconds_count{phase="swap"} 6.0' in metrics
    # Deltas moved fewer bytes than the Full did.
    assert all(h["fetchedBytes"] < first["fetchedBytes"] for h in status["history"][:5]), (
        json.dumps(status["history"], indent=1)
    )
