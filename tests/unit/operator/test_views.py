"""What the operator reads: pod reports, the versioned store, and its options."""

from __future__ import annotations

from typing import Any

import pytest

from hotload.api import ReplicaState
from hotload.errors import ConfigError
from hotload.kube.cache import Versioned, VersionedStore
from hotload.operator.options import operator_options, priority_from_uid
from hotload.operator.pods import pod_report


def pod_body(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "demo-2",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "42",
            "creationTimestamp": "2026-11-23T10:00:00Z",
            "labels": {"app.kubernetes.io/instance": "demo"},
            "annotations": {
                f"hotload.dev/{k.replace('_', '-')}": v for k, v in annotations.items()
            },
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "hotload.dev/SnapshotReady", "status": "True"},
            ]
        },
    }


def test_pod_report_reads_the_sidecar_annotations_and_gate() -> None:
    report = pod_report(
        pod_body(
            snapshot="s1", target="s2", state="Failed", since="2026-11-23T10:00:05Z", via="delta",
            reason="ChecksumMismatch", message="bad", failed_snapshot="s2",
        )
    )  # fmt: skip
    assert report is not None
    assert (report.served_identity, report.target_identity, report.state) == (
        "s1", "s2", ReplicaState.FAILED,
    )  # fmt: skip
    assert (report.reason, report.failed_identity, report.serves_verified) == (
        "ChecksumMismatch", "s2", True,
    )  # fmt: skip
    assert report.ordinal == 2 and report.is_desired(3) and not report.is_desired(2)


def test_pod_report_tolerates_what_it_cannot_parse() -> None:
    report = pod_report(pod_body(state="Dancing", since="yesterday", via="teleport"))
    assert report is not None
    assert (report.state, report.since, report.load_path) == (None, None, None)
    assert pod_report({"metadata": {"name": "x"}}) is None  # not a replica


def versioned(version: str, value: str = "v", uid: str = "u") -> Versioned[str]:
    return Versioned(uid, version, value)


def test_store_keeps_the_newer_version() -> None:
    store: VersionedStore[str] = VersionedStore()
    assert store.upsert("a", "u", "10", "new")
    assert not store.upsert("a", "u", "9", "old")
    assert not store.upsert("a", "u", "10", "same")
    assert store.get("a") == "new"


def test_a_list_taken_before_a_deletion_cannot_resurrect_it() -> None:
    store: VersionedStore[str] = VersionedStore()
    store.upsert("a", "u", "10", "x")
    store.delete("a", "u", "12")
    store.reseed({"a": versioned("10")}, "11")
    assert store.get("a") is None


def test_a_list_drops_what_vanished_before_it_and_keeps_what_came_after() -> None:
    store: VersionedStore[str] = VersionedStore()
    store.upsert("gone", "u1", "5", "x")  # deleted while we were not watching
    store.upsert("new", "u2", "30", "y")  # created after the list was taken
    store.reseed({"kept": versioned("7")}, "20")
    assert sorted(store) == ["kept", "new"]


def test_a_recreated_object_replaces_the_old_one_and_old_deletes_do_not_remove_it() -> None:
    store: VersionedStore[str] = VersionedStore()
    store.upsert("a", "old", "10", "x")
    store.upsert("a", "new", "20", "y")
    assert not store.delete("a", "old", "15")
    assert store.get("a") == "y"


def test_priority_from_the_pod_uid_is_stable_and_distinct() -> None:
    first = priority_from_uid("6a1c2b44-0000-4000-8000-000000000001")
    assert first == priority_from_uid("6a1c2b44-0000-4000-8000-000000000001")
    assert first != priority_from_uid("6a1c2b44-0000-4000-8000-000000000002")
    assert 0 <= first < 2**31


def test_options_from_flags_and_the_pod_environment() -> None:
    env = {"POD_UID": "abc", "POD_IP": "127.3.1.4", "POD_NAME": "hotload-operator-0"}
    options = operator_options(
        namespaces=["hl-*"], all_namespaces=False, peering="hotload", standalone=False,
        priority=None, port=8080, environ=env,
    )  # fmt: skip
    assert options.priority == priority_from_uid("abc")
    assert (options.host, options.identity, options.cluster_wide) == (
        "127.3.1.4", "hotload-operator-0", False,
    )  # fmt: skip
    explicit = operator_options(
        namespaces=[], all_namespaces=True, peering=None, standalone=True, priority=7,
        port=9000, environ=env,
    )  # fmt: skip
    assert explicit.priority == 7 and explicit.cluster_wide


def test_the_lease_runs_kopf_without_peering_in_the_pods_namespace() -> None:
    env = {"POD_NAME": "hotload-operator-0", "POD_NAMESPACE": "hotload-system"}
    options = operator_options(
        namespaces=["hl-*"], all_namespaces=False, peering=None, standalone=False,
        priority=None, port=8080, environ=env, lease="hotload-leader",
    )  # fmt: skip
    assert (options.lease, options.lease_namespace) == ("hotload-leader", "hotload-system")
    assert options.kopf_standalone  # every replica runs kopf; the Lease decides who writes


@pytest.mark.parametrize(
    "flags",
    [
        {"namespaces": ["a"], "all_namespaces": True},
        {"peering": "x", "standalone": True},
        {"port": 0},
        {"lease": "l", "peering": "x"},
        {"lease": "l", "standalone": True},
        {"lease": "l"},  # no namespace for it: neither --lease-namespace nor $POD_NAMESPACE
    ],
)
def test_contradicting_flags_are_usage_errors(flags: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "namespaces": [], "all_namespaces": False, "peering": None, "standalone": False,
        "priority": None, "port": 8080, "environ": {},
    }  # fmt: skip
    with pytest.raises(ConfigError):
        operator_options(**{**base, **flags})
