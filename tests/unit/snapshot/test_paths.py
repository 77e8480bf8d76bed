"""``inside``: the fast answer (no symlink on the way) and the full check (a symlink)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.errors import UnsafePath
from hotload.snapshot.paths import inside


def test_a_plain_path_is_root_joined_with_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.safetensors").write_bytes(b"x")
    assert inside(tmp_path, "sub/model.safetensors") == tmp_path / "sub" / "model.safetensors"
    assert inside(tmp_path, "not/there/yet.json") == tmp_path / "not" / "there" / "yet.json"


def test_a_symlinked_directory_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "sub").symlink_to(outside)
    with pytest.raises(UnsafePath):
        inside(root, "sub/model.safetensors")


def test_a_symlinked_file_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret").write_text("no")
    (root / "config.json").symlink_to(tmp_path / "secret")
    with pytest.raises(UnsafePath):
        inside(root, "config.json")


def test_a_symlink_that_stays_inside_resolves_to_its_target(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    root.mkdir()
    (root / "real.json").write_text("{}")
    (root / "alias.json").symlink_to(root / "real.json")
    assert inside(root, "alias.json") == root / "real.json"


def test_a_symlinked_root_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "a.json").write_text("{}")
    assert inside(tmp_path / "link", "a.json").read_text() == "{}"
