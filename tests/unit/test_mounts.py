from __future__ import annotations

from pathlib import Path

import pytest

from hotload.errors import ConfigError
from hotload.mounts import host_path, root_from


def test_a_real_pod_uses_the_mount_path_as_is() -> None:
    assert host_path("/var/lib/hotload/staging", None) == Path("/var/lib/hotload/staging")


def test_the_local_runtime_maps_mount_paths_under_its_root(tmp_path: Path) -> None:
    assert host_path("/var/lib/hotload/staging", tmp_path) == tmp_path / "var/lib/hotload/staging"


@pytest.mark.parametrize("bad", ["relative/path", "/var/../etc"])
def test_bad_mount_paths_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        host_path(bad, None)


def test_root_from_env_value() -> None:
    assert root_from(None) is None and root_from("") is None
    assert root_from("/tmp/pod") == Path("/tmp/pod")
    with pytest.raises(ConfigError):
        root_from("pods/x")
