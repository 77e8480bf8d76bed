"""A download into a volume that fills (issue 22, finding 8): a real tmpfs of a few MiB.

On the code before this test, a full volume failed a download in its middle with a bare
``OSError`` (an untyped ``InternalError`` for the sidecar) and left the partial file
behind; now the whole size is claimed first, the error is ``DiskFull`` (transient), the
partial file and its record are removed, and the same download succeeds once there is room.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hotload.errors import DiskFull
from hotload.storage import DownloadResult, Storage
from tests.fixtures.small_volume import SmallVolume, small_volume
from tests.integration.storage.test_backends import payload

MIB = 1 << 20


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[SmallVolume]:
    with small_volume(tmp_path / "staging", 4 * MIB) as mounted:
        yield mounted


@pytest.mark.parametrize("part_size", [256 * 1024, 8 * MIB], ids=["parted", "one-part"])
async def test_a_full_volume_is_disk_full_leaves_no_partial_and_retries_when_space_returns(
    storage: Storage, volume: SmallVolume, part_size: int
) -> None:
    data = payload(3 * MIB, seed=22)
    await storage.put("s1/model.safetensors", data)
    dest = volume.path / "fetch" / "s1" / "model.safetensors"
    partial = volume.path / "partial" / "s1" / "model.safetensors"
    volume.fill(leave=1 * MIB)  # room for a third of the object: it fails mid-fetch

    async def fetch() -> DownloadResult:
        return await storage.download(
            "s1/model.safetensors",
            dest,
            expected_size=len(data),
            part_size=part_size,
            concurrency=2,
            partial=partial,
        )

    with pytest.raises(DiskFull) as caught:
        await fetch()
    assert caught.value.transient
    assert caught.value.context["key"] == "s1/model.safetensors"
    assert not dest.exists()
    left = [f for f in volume.files() if not Path(volume.path / f).is_dir()]
    assert left == [], f"partial files left on the full volume: {left}"
    assert volume.free() >= 1 * MIB - 64 * 1024, "the failed download still holds room"

    volume.release()
    result = await fetch()
    assert result.size == len(data) and dest.read_bytes() == data
    assert [f for f in volume.files() if not Path(volume.path / f).is_dir()] == [
        "fetch/s1/model.safetensors"
    ]
