"""The pinned tool versions: one place (hack/versions.env), mirrored for installs."""

from __future__ import annotations

import pytest

from hotload.errors import ConfigError
from hotload.local import versions


def test_embedded_versions_equal_hack_versions_env() -> None:
    path = versions.versions_env_path()
    assert path is not None, "tests run from a checkout"
    assert versions.parse_versions_env(path.read_text()) == versions.EMBEDDED_VERSIONS


def test_every_tool_names_a_pinned_version() -> None:
    pinned = versions.load_versions()
    for tool, key in versions.TOOL_VERSION_KEYS.items():
        assert versions.tool_version(tool) == pinned[key]
    assert versions.tool_version("kubectl") == versions.tool_version("kube-apiserver")


def test_malformed_versions_line_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        versions.parse_versions_env("# comment\nKUBERNETES_VERSION=v1\nnot a pin\n")
    assert refused.value.context["line"] == 3


def test_unknown_tool_has_no_version() -> None:
    with pytest.raises(ConfigError):
        versions.tool_version("docker")
