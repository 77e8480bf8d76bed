"""Objects the chart's tests create."""

from __future__ import annotations

from typing import Any

IDLE = "idle"


def idle_deployment_body(name: str = IDLE) -> dict[str, Any]:
    """A RolloutDeployment of zero replicas: something to reconcile, no pods to start."""
    return {
        "apiVersion": "hotload.dev/v1alpha1",
        "kind": "RolloutDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "m", "servedName": "m"},
            "engine": {"kind": "noop"},
            "replicas": 0,
            "hotLoad": {"bucketUrl": "file:///nonexistent"},
        },
    }
