"""Binaries come from the cache at their pinned versions; a missing one names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.errors import ToolMissing
from hotload.local import tools, up


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("HOTLOAD_CACHE", str(cache))
    return cache


def test_tool_path_is_name_dash_pinned_version(empty_cache: Path) -> None:
    binary = empty_cache / "bin" / "kubectl-v1.35.4"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert tools.kubectl_path() == binary
    assert tools.missing_tools(["kubectl", "kwok"]) == ["kwok"]


def test_a_missing_binary_names_the_build_script(empty_cache: Path) -> None:
    with pytest.raises(ToolMissing) as missing:
        tools.kubectl_path()
    assert "hack/build-tools" in str(missing.value)
    assert missing.value.context["expected"] == str(empty_cache / "bin" / "kubectl-v1.35.4")


def test_up_without_binaries_fails_before_touching_the_state(
    empty_cache: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with pytest.raises(ToolMissing, match="hack/build-tools"):
        up(regions=1, state_dir=state, index_base=250)
    assert not state.exists()
