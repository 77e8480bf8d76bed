"""The public surface of hotload.local: a rename is a deliberate act."""

from __future__ import annotations

import hotload.local


def test_public_names_are_pinned() -> None:
    assert sorted(hotload.local.__all__) == [
        "LocalRegions",
        "ProcessSpec",
        "Region",
        "RegionPorts",
        "RegionStatus",
        "Wave",
        "cache_dir",
        "down",
        "helm_path",
        "kubectl_path",
        "load",
        "state_dir",
        "status",
        "tool_path",
        "up",
    ]
    for name in hotload.local.__all__:
        assert getattr(hotload.local, name) is not None
