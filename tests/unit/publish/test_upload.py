"""Uploads put every file before the manifest, in parallel, and stop before the manifest
when a file fails: a reader never finds a manifest whose files are not all there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hotload.errors import ManifestInvalid, StorageRejected
from hotload.snapshot import MANIFEST_NAME
from hotload.snapshot.publish import upload_snapshot
from hotload.storage import open_storage


class RecordingStorage:
    """A real file:// storage that records the order of writes and how many overlap."""

    def __init__(self, root: Path, fail: str | None = None) -> None:
        self.inner = open_storage(f"file://{root}")
        self.order: list[str] = []
        self.active = 0
        self.most_active = 0
        self.fail = fail

    @property
    def url(self) -> str:
        return self.inner.url

    async def put_file(self, key: str, src: Path) -> None:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            await asyncio.sleep(0.01)
            if self.fail and key.endswith(self.fail):
                raise StorageRejected("refused", key=key)
            await self.inner.put_file(key, src)
            self.order.append(key)
        finally:
            self.active -= 1


def snapshot_dir(tmp_path: Path, files: int) -> Path:
    directory = tmp_path / "snap"
    (directory / "sub").mkdir(parents=True)
    for index in range(files):
        (directory / "sub" / f"part-{index}.bin").write_bytes(bytes([index]) * 100)
    (directory / MANIFEST_NAME).write_text("{}")
    return directory


async def test_files_go_up_in_parallel_and_the_manifest_last(tmp_path: Path) -> None:
    storage = RecordingStorage(tmp_path / "bucket")
    report = await upload_snapshot(
        storage,  # type: ignore[arg-type]
        snapshot_dir(tmp_path, 6),
        "snap-1",
        concurrency=3,
    )
    assert storage.order[-1] == f"snap-1/{MANIFEST_NAME}"
    assert len(storage.order) == 7 == len(report.keys)
    assert storage.most_active == 3
    assert report.bytes == 6 * 100 + 2


async def test_a_failed_file_means_no_manifest(tmp_path: Path) -> None:
    storage = RecordingStorage(tmp_path / "bucket", fail="part-2.bin")
    with pytest.raises(StorageRejected):
        await upload_snapshot(storage, snapshot_dir(tmp_path, 5), "snap-1")  # type: ignore[arg-type]
    assert f"snap-1/{MANIFEST_NAME}" not in storage.order
    assert not (tmp_path / "bucket" / "snap-1" / MANIFEST_NAME).exists()


async def test_a_directory_without_a_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestInvalid):
        await upload_snapshot(open_storage(f"file://{tmp_path}/b"), tmp_path / "empty", "x")
