"""Fixtures of the sidecar's integration tests: a bucket, a trainer, replicas in a region."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from hotload.local import LocalRegions
from hotload.storage import Storage, open_storage
from tests.fixtures.trainer import Trainer
from tests.integration.engines.conftest import EngineProcess, start_engine, stop_engine
from tests.integration.sidecar.front_server import (
    MAX_DEPTH,
    MAX_REQUEST_BYTES,
    FrontServer,
    StandInAgent,
)
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


@pytest.fixture(scope="module")
def front_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """A reference engine process for the front's tests (one per module)."""
    process = start_engine(Path(tmp_path_factory.mktemp("front-engine")))
    try:
        yield process
    finally:
        stop_engine(process)


@pytest.fixture(scope="module")
def front(front_engine: EngineProcess) -> Iterator[FrontServer]:
    """A real front before ``front_engine``, with the test caps of front_server.py."""
    agent = StandInAgent(front_engine.base_url, front_engine.started_as["identity"])
    with FrontServer(
        agent, max_request_bytes=MAX_REQUEST_BYTES, max_json_depth=MAX_DEPTH
    ) as server:
        yield server
