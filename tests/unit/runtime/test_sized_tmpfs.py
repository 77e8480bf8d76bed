"""A Memory emptyDir's sizeLimit: the quantity, and a real tmpfs of that size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hotload.errors import ContainerConfigInvalid
from hotload.local.runtime.sized_tmpfs import (
    can_mount,
    mount_sized,
    quantity_bytes,
    unmount_under,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64Mi", 64 << 20),
        ("3M", 3_000_000),
        ("1500000", 1_500_000),
        ("1.5Gi", 3 << 29),
        (4096, 4096),
    ],
)
def test_quantities_of_bytes(text: object, size: int) -> None:
    assert quantity_bytes(text) == size


@pytest.mark.parametrize("text", ["", "64MB", "-1", "10m", "Mi"])
def test_what_is_not_a_quantity_of_bytes_is_refused(text: str) -> None:
    with pytest.raises(ContainerConfigInvalid):
        quantity_bytes(text)


def test_a_sized_folder_is_a_tmpfs_of_that_size_until_unmounted(tmp_path: Path) -> None:
    if not can_mount():
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "memory" / "pod" / "staging"
    folder.mkdir(parents=True)
    assert mount_sized(folder, 2 << 20)
    assert mount_sized(folder, 2 << 20), "a second call mounts nothing more"
    try:
        stats = os.statvfs(folder)
        assert stats.f_blocks * stats.f_frsize == 2 << 20
        with pytest.raises(OSError) as caught:
            (folder / "big").write_bytes(b"x" * (3 << 20))
        assert caught.value.errno == 28
    finally:
        unmount_under(tmp_path / "memory")
    assert not os.path.ismount(folder)
