"""The public names of hotload.sidecar and hotload.kube: a rename is a deliberate act."""

from __future__ import annotations

import hotload.kube
import hotload.sidecar


def test_sidecar_exports() -> None:
    assert sorted(hotload.sidecar.__all__) == ["AgentConfig", "RetryPolicy", "SidecarAgent"]


def test_kube_exports() -> None:
    assert sorted(hotload.kube.__all__) == [
        "API_EXCEPTIONS",
        "async_api_client",
        "kube_errors",
        "kubeconfig_from",
        "map_api_exception",
        "sync_api_client",
    ]
