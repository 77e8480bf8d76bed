"""The sidecar reads manifests up to the format's own limit (64 MiB), not the storage's
16 MiB default; past it the manifest is refused as invalid (a bad snapshot), never as an
object-too-large storage error."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hotload.errors import ManifestInvalid, ObjectTooLarge
from hotload.sidecar.loader import SnapshotLoader
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.staging import StagingArea
from hotload.snapshot import MANIFEST_NAME
from hotload.snapshot.limits import MAX_MANIFEST_BYTES
from hotload.storage import open_storage
from hotload.storage.protocol import DEFAULT_GET_LIMIT

MIB = 1024 * 1024


def _loader(bucket: Path, tmp_path: Path) -> SnapshotLoader:
    return SnapshotLoader(
        open_storage(f"file://{bucket}"),
        StagingArea(tmp_path / "staging"),
        AgentMetrics(CollectorRegistry()),
        concurrency=1,
        part_size=MIB,
        decode_threads=1,
        on_phase=lambda _: None,
        on_bytes=lambda _a, _b: None,
    )


@pytest.mark.parametrize(
    ("size", "problem"),
    [(DEFAULT_GET_LIMIT + MIB, "format"), (MAX_MANIFEST_BYTES + MIB, "size limit")],
    ids=["over-the-storage-default", "over-the-format-limit"],
)
async def test_a_big_manifest_is_read_up_to_the_format_limit(
    tmp_path: Path, size: int, problem: str
) -> None:
    bucket = tmp_path / "bucket"
    (bucket / "s-1").mkdir(parents=True)
    (bucket / "s-1" / MANIFEST_NAME).write_bytes(b"{" + b" " * (size - 2) + b"}")
    loader = _loader(bucket, tmp_path)
    with pytest.raises(ManifestInvalid) as raised:
        await loader.manifest("s-1")
    assert not isinstance(raised.value, ObjectTooLarge)
    assert problem in str(raised.value)
    await loader.storage.aclose()
