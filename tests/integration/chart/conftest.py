"""Fixtures of the chart's tests: a RolloutDeployment with nothing to run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.integration.chart.objects import IDLE, idle_deployment_body


@pytest.fixture
def idle_deployment(
    operated_namespace: str, kube_clients: dict[str, k8s.ApiClient]
) -> Iterator[str]:
    """An idle RolloutDeployment in the operated namespace of every region."""
    for api in kube_clients.values():
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(
            "hotload.dev", "v1alpha1", operated_namespace, "rolloutdeployments",
            idle_deployment_body(),
        )  # fmt: skip
    yield IDLE
