"""The publisher's coordinated switch against real apiservers (the session's regions).

No operator watches ``t-*`` namespaces: the test writes each PolicySnapshot's
``stagedReplicas``/``desiredReplicas`` itself, as the operator would from its replicas'
reports, and reads what the publisher wrote. Would catch: a commit before every region is
Staged, regions given different switch times or deadlines, a decision rewritten, a region
that was down at the decision never getting it, an abort not written everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api.labels import (
    SWITCH_ABORTED_ANNOTATION,
    SWITCH_AT_ANNOTATION,
    SWITCH_BY_ANNOTATION,
)
from hotload.api.switch import SwitchDecision, parse_switch_time
from hotload.local import LocalRegions
from hotload.publish import Publisher
from hotload.waiting import wait_until
from tests.fixtures.apiserver_outage import apiserver_down
from tests.fixtures.cluster import SESSION_CHART
from tests.integration.publish.test_publisher_regions import (
    Scene,
    deployment,
    settings,
    weights,
)

pytestmark = pytest.mark.cluster
__all__ = ["weights"]  # the fixture, shared with the regions' tests

IDENTITY = "run-step-0-full"


SceneOf = Callable[[dict[str, Any]], Scene]
"""A scene whose regions' deployments coordinate their switch with these ``spec.rollout``
settings (``switch: Coordinated`` added)."""


def _leases_held(regions: LocalRegions, clients: dict[str, k8s.ApiClient]) -> bool:
    """The chart's leader Lease exists in every region (until it does, the chart's fencing
    policy refuses every PolicySnapshot update: it finds no parameter)."""
    lease = SESSION_CHART.operator_deployment.removesuffix("-operator") + "-leader"
    for name in regions.names:
        try:
            k8s.CoordinationV1Api(clients[name]).read_namespaced_lease(
                lease, SESSION_CHART.namespace
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return False
            raise
    return True


@pytest.fixture
def coordinated(
    tmp_path: Path,
    operated_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
    weights: list[Path],
) -> SceneOf:
    local_regions = operated_regions
    assert wait_until(lambda: _leases_held(local_regions, kube_clients), 120, interval_s=0.5)

    def make(rollout: dict[str, Any]) -> Scene:
        buckets = {}
        for name in local_regions.names:
            bucket = tmp_path / f"bucket-{name}"
            bucket.mkdir()
            body = deployment(bucket)
            body["spec"]["rollout"] = {"switch": "Coordinated", **rollout}
            k8s.CustomObjectsApi(kube_clients[name]).create_namespaced_custom_object(
                "hotload.dev", "v1alpha1", namespace, "rolloutdeployments", body
            )
            buckets[name] = bucket
        return Scene(local_regions, kube_clients, namespace, buckets, weights, tmp_path / "work")

    return make


def _stage(scene: Scene, region: str, staged: int, desired: int = 2) -> None:
    """What the region's operator writes from its replicas' reports."""
    k8s.CustomObjectsApi(scene.clients[region]).patch_namespaced_custom_object_status(
        "hotload.dev", "v1alpha1", scene.namespace, "policysnapshots", IDENTITY,
        {"status": {"stagedReplicas": staged, "desiredReplicas": desired}},
    )  # fmt: skip


def _annotations(scene: Scene, region: str) -> dict[str, str]:
    try:
        body = k8s.CustomObjectsApi(scene.clients[region]).get_namespaced_custom_object(
            "hotload.dev", "v1alpha1", scene.namespace, "policysnapshots", IDENTITY
        )
    except k8s.ApiException as err:
        if err.status == 404:
            return {}
        raise
    return dict(body["metadata"].get("annotations") or {})


def _applied_everywhere(scene: Scene) -> None:
    assert wait_until(
        lambda: all(_annotations(scene, r) for r in scene.regions.names), 60, interval_s=0.2
    ), "the PolicySnapshot was not applied in every region"


def test_one_switch_time_is_committed_everywhere_once_every_replica_is_staged(
    coordinated: SceneOf,
) -> None:
    scene = coordinated({"stagingTimeoutSeconds": 120, "leadMilliseconds": 1500})
    first, second = scene.regions.names
    with Publisher(settings(scene)) as publisher:
        handle = publisher.publish(scene.weights[0], 0)
        _applied_everywhere(scene)
        deadlines = {_annotations(scene, r)[SWITCH_BY_ANNOTATION] for r in scene.regions.names}
        assert len(deadlines) == 1, "every region gets the same deadline"
        _stage(scene, first, 2)
        _stage(scene, second, 1)
        # One replica is not Staged yet: nobody is told a switch time.
        assert not wait_until(handle.done, 2.0, interval_s=0.1)
        assert all(SWITCH_AT_ANNOTATION not in _annotations(scene, r) for r in scene.regions.names)
        staged_at = datetime.now(UTC)
        _stage(scene, second, 2)
        result = handle.result(timeout=60)
    switch = result.switch
    assert switch is not None and switch.decision is SwitchDecision.COMMITTED
    assert switch.all_staged and switch.undelivered == []
    assert switch.staged == {first: "2/2", second: "2/2"}
    at = parse_switch_time(switch.at)
    assert at is not None
    lead = timedelta(milliseconds=1500)
    assert staged_at + lead - timedelta(milliseconds=5) <= at <= datetime.now(UTC) + lead
    for region in scene.regions.names:
        assert _annotations(scene, region)[SWITCH_AT_ANNOTATION] == switch.at


def test_a_region_down_at_the_decision_gets_it_when_back_and_meanwhile_presumes_the_same(
    coordinated: SceneOf,
) -> None:
    scene = coordinated({"stagingTimeoutSeconds": 6, "leadMilliseconds": 500})
    up, down = scene.regions.names
    with Publisher(settings(scene)) as publisher:
        handle = publisher.publish(scene.weights[0], 0)
        _applied_everywhere(scene)
        _stage(scene, up, 2)
        with apiserver_down(scene.regions.region(down)):
            began = time.monotonic()
            result = handle.result(timeout=60)
            # The staging timeout, not the region's outage, ended the wait.
            assert time.monotonic() - began < 30
            switch = result.switch
            assert switch is not None and switch.decision is SwitchDecision.COMMITTED
            assert _annotations(scene, up)[SWITCH_AT_ANNOTATION] == switch.at
        # Follow: at the deadline, exactly what the region that was down presumed.
        assert switch.at == switch.deadline and not switch.all_staged
        assert switch.undelivered == [down] and switch.staged[down] == "?"
        assert result.ok
        assert publisher.flush(timeout_s=60) == {}
    assert _annotations(scene, down)[SWITCH_AT_ANNOTATION] == switch.at


def test_abort_is_written_everywhere_when_a_replica_is_not_staged_in_time(
    coordinated: SceneOf,
) -> None:
    scene = coordinated(
        {"stagingTimeoutSeconds": 3, "leadMilliseconds": 500, "onStagingTimeout": "Abort"}
    )
    first, second = scene.regions.names
    with Publisher(settings(scene)) as publisher:
        handle = publisher.publish(scene.weights[0], 0)
        _applied_everywhere(scene)
        _stage(scene, first, 2)
        _stage(scene, second, 1)
        result = handle.result(timeout=60)
    switch = result.switch
    assert switch is not None and switch.decision is SwitchDecision.ABORTED
    assert switch.at is None and not result.ok
    for region in scene.regions.names:
        notes = _annotations(scene, region)
        assert SWITCH_ABORTED_ANNOTATION in notes and SWITCH_AT_ANNOTATION not in notes
