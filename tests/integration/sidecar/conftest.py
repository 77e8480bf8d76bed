"""Fixtures of the sidecar's integration tests: a bucket, a trainer, replicas in a region."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from hotload.local import LocalRegions
from hotload.storage import Storage, open_storage
from tests.fixtures.trainer import Trainer
from tests.integration.sidecar.harness import SidecarHarness


@pytest.fixture
def bucket_dir(tmp_path: Path) -> Path:
    path = tmp_path / "bucket"
    path.mkdir()
    return path


@pytest.fixture
def bucket_url(bucket_dir: Path) -> str:
    return f"file://{bucket_dir}"


@pytest.fixture
async def storage(bucket_url: str) -> AsyncIterator[Storage]:
    store = open_storage(bucket_url)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
def trainer(tmp_path: Path, storage: Storage) -> Trainer:
    return Trainer(tmp_path / "trainer", storage)


@pytest.fixture
def harness(
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
    tmp_path: Path,
) -> Iterator[SidecarHarness]:
    region = local_regions.regions[0]
    harness = SidecarHarness(kube_clients[region.name], region, namespace, tmp_path / "pods")
    harness.workdir.mkdir()
    try:
        yield harness
    finally:
        harness.stop_all()
