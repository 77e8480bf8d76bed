"""Both backends behind one fixture: every behaviour is checked on file:// and on real MinIO."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hotload.storage import RetryPolicy, Storage, open_storage
from tests.fixtures.minio import MinioServer

#: Quick retries so tests of transient failures stay short.
FAST_RETRY = RetryPolicy(attempts=40, initial_s=0.05, maximum_s=0.4, jitter=1.0)


def open_backend(kind: str, tmp_path: Path, minio: MinioServer | None) -> Storage:
    if kind == "file":
        return open_storage(f"file://{tmp_path / 'bucket'}/snapshots", retry=FAST_RETRY)
    assert minio is not None
    return open_storage(
        f"s3://{minio.make_bucket()}/snapshots",
        endpoint=minio.endpoint,
        region="us-east-1",
        credentials=minio.credentials,
        retry=FAST_RETRY,
    )


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    """A fresh, empty bucket on each backend."""
    minio = request.getfixturevalue("minio") if request.param == "s3" else None
    backend = open_backend(request.param, tmp_path, minio)
    try:
        yield backend
    finally:
        await backend.aclose()
