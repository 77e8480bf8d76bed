"""Storage that fails, then recovers; a sidecar killed mid-download (s3 through a proxy)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hotload.local.trainer import PublishedSnapshot
from hotload.storage import Storage, open_storage
from tests.fixtures.minio import TEST_ACCESS_KEY, TEST_SECRET_KEY, MinioServer
from tests.fixtures.trainer import PROBE_TOKENS, Trainer
from tests.integration.sidecar.harness import (
    Replica,
    SidecarHarness,
    eventually,
    rollout_deployment,
)
from tests.integration.sidecar.toxiproxy import Toxiproxy, toxiproxy  # noqa: F401 (fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.s3]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY}
#: Small parts and few at once, so a slowed download is in the middle for seconds.
SLOW_DOWNLOAD = ("--download-part-size", "16384", "--download-concurrency", "2")


@pytest.fixture
async def s3(minio: MinioServer) -> AsyncIterator[tuple[str, Storage]]:
    url = f"s3://{minio.make_bucket()}/snapshots"
    store = open_storage(url, endpoint=minio.endpoint, credentials=minio.credentials)
    try:
        yield url, store
    finally:
        await store.aclose()


@pytest.fixture
def s3_trainer(tmp_path: Path, s3: tuple[str, Storage]) -> Trainer:
    return Trainer(tmp_path / "trainer", s3[1])


async def _bytes_done(harness: SidecarHarness, replica: Replica, at_least: int) -> int | None:
    status = await harness.status(replica)
    done = int(status["bytesDone"])
    return done if status["phase"] == "Fetching" and done >= at_least else None


async def _slow_full_download(
    name: str,
    harness: SidecarHarness,
    trainer: Trainer,
    url: str,
    minio: MinioServer,
    toxiproxy: Toxiproxy,  # noqa: F811
) -> tuple[Replica, PublishedSnapshot]:
    """A replica whose sidecar reaches the bucket through a slowed proxy, told to load a
    fresh Full snapshot: its download crawls, so a test can break it midway."""
    toxiproxy.create(f"127.0.0.1:{minio.port}")
    harness.create_deployment(rollout_deployment(name, url, endpoint=toxiproxy.endpoint))
    replica = await harness.replica(
        f"{name}-0", name, credentials=CREDENTIALS, sidecar_args=SLOW_DOWNLOAD
    )
    full = await trainer.publish_full()
    toxiproxy.slow(8)
    harness.set_target(name, full.ref())
    return replica, full


async def test_download_survives_a_storage_outage_and_completes(
    harness: SidecarHarness,
    s3_trainer: Trainer,
    s3: tuple[str, Storage],
    minio: MinioServer,
    toxiproxy: Toxiproxy,  # noqa: F811
) -> None:
    replica, full = await _slow_full_download(
        "outage", harness, s3_trainer, s3[0], minio, toxiproxy
    )
    await eventually(
        lambda: _bytes_done(harness, replica, 16384), timeout=60, what="a download under way"
    )

    toxiproxy.enabled(False)

    async def failing() -> bool:
        status = await harness.status(replica)
        error = status.get("lastError") or {}
        return error.get("reason") == "StorageUnavailable"

    await eventually(failing, timeout=60, what="the outage to be reported")
    annotations = harness.annotations("outage-0")
    assert annotations["hotload.dev/state"] == "Loading"
    assert (await harness.engine_identity(replica))["identity"] == "init"

    toxiproxy.fast()
    toxiproxy.enabled(True)
    await harness.wait_state(replica, full.identity, "Ready", timeout=90)
    status = await harness.status(replica)
    swap = status["history"][0]
    # The attempt that finished resumed: it read less than the snapshot stores.
    assert 0 < swap["fetchedBytes"] < swap["storedBytes"]
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["sha256"] == s3_trainer.expected_logits(full).sha256


async def test_sidecar_killed_mid_download_resumes_and_serves_only_verified_weights(
    harness: SidecarHarness,
    s3_trainer: Trainer,
    s3: tuple[str, Storage],
    minio: MinioServer,
    toxiproxy: Toxiproxy,  # noqa: F811
) -> None:
    replica, full = await _slow_full_download(
        "killed", harness, s3_trainer, s3[0], minio, toxiproxy
    )
    done = await eventually(
        lambda: _bytes_done(harness, replica, 3 * 16384), timeout=60, what="a third of the download"
    )
    harness.kill_sidecar(replica)
    partial = list((replica.staging / "partial" / full.identity).rglob("data"))
    assert partial, "the killed download left its partial file in staging"
    assert (await harness.engine_identity(replica))["identity"] == "init"

    toxiproxy.fast()
    await harness.wait_restarted(replica, 1)
    await harness.wait_state(replica, full.identity, "Ready", timeout=90)
    status = await harness.status(replica)
    swap = status["history"][0]
    assert swap["fetchedBytes"] <= swap["storedBytes"] - done + 16384 * 2
    engine = await harness.engine_identity(replica)
    assert engine["identity"] == full.identity
    assert engine["swaps"] == 1, "the engine was handed exactly one snapshot: the verified one"
    served = await harness.engine_logits(replica, PROBE_TOKENS)
    assert served["sha256"] == s3_trainer.expected_logits(full).sha256
