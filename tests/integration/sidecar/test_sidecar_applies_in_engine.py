"""A one-delta step is patched into the engine's live weights; a refusal falls back.

Real pods (``hotload engine reference`` + ``hotload sidecar`` run by the pod runtime), a
real region, real snapshots from the trainer. The sidecar hands the fetched, verified
delta to the engine's ``/admin/apply_delta`` when the engine's own report says it serves
the delta's previous snapshot; the engine's digest and logits then prove the weights bit
for bit, and staging catches up after Ready (the served buffer comes to hold the served
snapshot, so a restarted engine reloads it). When the engine refuses — a delta it cannot
patch (a tensor its weights do not hold), or a patched tensor failing its check — it
keeps its old weights and the sidecar loads the rebuilt directory (or, when that fails
too, says Failed while the old weights serve on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file, save_file

from hotload.local.trainer import PublishedSnapshot
from hotload.snapshot import manifest_digest, read_manifest
from hotload.storage import Storage
from tests.fixtures.trainer import PROBE_TOKENS, Trainer
from tests.integration.sidecar.harness import (
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
)
from tests.unit.snapshot import tampering

pytestmark = pytest.mark.cluster

TIED_ALIAS = ("lm_head.weight", "model.embed_tokens.weight")


class AliasingTrainer(Trainer):
    """Once ``write_alias`` is set, its snapshots carry the tied ``lm_head.weight`` beside
    the embeddings it equals (as some trainers' savers write it): a tensor the engine's
    held weights do not have, so it cannot patch such a delta in place — while a load of
    the rebuilt directory accepts the alias."""

    write_alias = False

    def model_files(self, directory: Path) -> Path:
        out = super().model_files(directory)
        if self.write_alias:
            path = out / "model.safetensors"
            tensors = load_file(str(path))
            alias, canonical = TIED_ALIAS
            tensors[alias] = tensors[canonical].clone()
            save_file(tensors, str(path), metadata={"format": "pt"})
        return out


async def assert_serves(
    harness: SidecarHarness, replica: Replica, trainer: Trainer, snapshot: PublishedSnapshot
) -> dict[str, Any]:
    """The engine names ``snapshot`` and computes its logits bit for bit; its identity
    report (with the engine's counters)."""
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["identity"] == snapshot.identity
    assert served["sha256"] == trainer.expected_logits(snapshot).sha256
    return await harness.engine_identity(replica)


async def serving_a_full(
    harness: SidecarHarness, trainer: Trainer, bucket_url: str, name: str
) -> tuple[Replica, PublishedSnapshot, int]:
    """A replica of a new deployment ``name`` Ready at a new Full: the replica, the Full,
    and the engine's count of deltas patched in place so far."""
    harness.create_deployment(rollout_deployment(name, bucket_url))
    replica = await harness.replica(f"{name}-0", name)
    full = await trainer.publish_full()
    harness.set_target(name, full.ref())
    annotations = await harness.wait_state(replica, full.identity, "Ready")
    assert annotations["hotload.dev/via"] == "full"
    engine = await assert_serves(harness, replica, trainer, full)
    return replica, full, int(engine["deltas_applied"])


async def staging_holds(harness: SidecarHarness, replica: Replica, identity: str) -> None:
    """Wait until the served buffer (``/status.buffers``) holds ``identity``."""

    async def caught_up() -> bool:
        buffers = (await harness.status(replica))["buffers"]
        served = buffers.get("served")
        return served is not None and buffers.get(served) == identity

    await eventually(caught_up, timeout=60, what=f"staging catching up with {identity}")


async def test_a_delta_is_patched_in_the_engine_bit_exact_and_staging_catches_up(
    harness: SidecarHarness, trainer: Trainer, bucket_dir: Path, bucket_url: str
) -> None:
    replica, full, before = await serving_a_full(harness, trainer, bucket_url, "inplace")

    for round_ in range(1, 3):
        trainer.train_step()
        delta = await trainer.publish_delta()
        harness.set_target("inplace", delta.ref())
        annotations = await harness.wait_state(replica, delta.identity, "Ready")
        assert annotations["hotload.dev/snapshot"] == delta.identity
        assert annotations["hotload.dev/via"] == "delta"
        engine = await assert_serves(harness, replica, trainer, delta)
        assert engine["deltas_applied"] == before + round_, "patched in place, not loaded"
        expected = manifest_digest(read_manifest(bucket_dir / delta.identity))
        assert await engine_digest(replica) == expected
        record = (await harness.status(replica))["history"][0]
        assert record["identity"] == delta.identity and record["inEngine"] is True
        assert "rebuild" not in record["seconds"]
        assert record["fetchedBytes"] < full.stored_bytes
        # Off the critical path, the served buffer comes to hold the served snapshot.
        await staging_holds(harness, replica, delta.identity)
        assert harness.annotations(replica.pod)["hotload.dev/state"] == "Ready"

    # An engine restart now reloads the snapshot it served, from staging.
    last = trainer.published[-1]
    harness.kill(replica, "engine")
    await harness.wait_restarted(replica, 1, "engine")

    async def reloaded() -> bool:
        annotations = harness.annotations(replica.pod)
        return (
            annotations.get("hotload.dev/snapshot") == last.identity
            and annotations.get("hotload.dev/via") == "reload"
            and annotations.get("hotload.dev/state") == "Ready"
        )

    await eventually(reloaded, timeout=120, what="the served snapshot reloaded")
    await assert_serves(harness, replica, trainer, last)


async def engine_digest(replica: Replica) -> str:
    """The digest of the weights the engine serves, in its own words."""
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(
            f"{replica.engine_url}/admin/identity", params={"digest": "true"}, timeout=30
        )
        response.raise_for_status()
        digest: str = response.json()["digest"]
        return digest


async def test_a_delta_the_engine_cannot_patch_is_loaded_as_a_directory(
    harness: SidecarHarness, storage: Storage, tmp_path: Path, bucket_url: str
) -> None:
    trainer = AliasingTrainer(tmp_path / "aliasing", storage)
    replica, _, before = await serving_a_full(harness, trainer, bucket_url, "fallback")

    trainer.train_step()
    trainer.write_alias = True
    delta = await trainer.publish_delta()
    harness.set_target("fallback", delta.ref())
    annotations = await harness.wait_state(replica, delta.identity, "Ready")
    assert annotations["hotload.dev/via"] == "delta"
    engine = await assert_serves(harness, replica, trainer, delta)
    assert engine["deltas_applied"] == before, "refused in place, loaded as a directory"
    record = (await harness.status(replica))["history"][0]
    assert record["inEngine"] is False and "rebuild" in record["seconds"]
    assert "loading the rebuilt directory" in harness.log(replica, "sidecar", tail=1 << 20)


async def test_a_patched_tensor_failing_its_check_keeps_the_old_weights(
    harness: SidecarHarness, trainer: Trainer, bucket_dir: Path, bucket_url: str
) -> None:
    """A delta whose stored files check out but whose decoded tensor does not (a broken
    encoder, files re-signed): the engine undoes its patch and keeps serving the Full;
    the directory rebuild fails the same check, a replay from the bucket too, and the
    replica says Failed/ChecksumMismatch — never the delta."""
    replica, full, before = await serving_a_full(harness, trainer, bucket_url, "refused")

    trainer.train_step()
    delta = await trainer.publish_delta()
    stored = bucket_dir / delta.identity
    blob = next(stored.glob("hotload-delta-*.bin"))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x10
    blob.write_bytes(bytes(data))
    tampering.resign(stored)

    harness.set_target("refused", delta.ref())
    annotations = await harness.wait_state(replica, delta.identity, "Failed", timeout=120)
    assert annotations["hotload.dev/reason"] in ("ChecksumMismatch", "DecodeFailed")
    assert annotations["hotload.dev/snapshot"] == full.identity
    engine = await assert_serves(harness, replica, trainer, full)
    assert engine["deltas_applied"] == before
    assert "did not patch the delta in place" in harness.log(replica, "sidecar", tail=1 << 20)
