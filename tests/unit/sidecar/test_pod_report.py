"""What the sidecar writes on its Pod: annotations per transition and the readiness gate."""

from __future__ import annotations

from datetime import UTC, datetime

from hotload.api import LoadPath, ReplicaState, reasons
from hotload.api.pod import (
    ANNOTATION_DIGEST,
    ANNOTATION_FAILED_SNAPSHOT,
    ANNOTATION_MESSAGE,
    ANNOTATION_REASON,
    ANNOTATION_SINCE,
    ANNOTATION_SNAPSHOT,
    ANNOTATION_STATE,
    ANNOTATION_TARGET,
    ANNOTATION_VIA,
    CONDITION_SNAPSHOT_READY,
    SIDECAR_ANNOTATIONS,
)
from hotload.sidecar.pod_report import (
    MESSAGE_LIMIT,
    PodAnnotations,
    annotation_patch,
    condition_patch,
    readiness_gate,
)

MOMENT = datetime(2026, 11, 23, 9, 45, 12, 345000, tzinfo=UTC)


def test_annotation_patch_names_every_sidecar_annotation_in_one_patch() -> None:
    report = PodAnnotations("s-4", "s-5", ReplicaState.LOADING, MOMENT, LoadPath.DELTA)
    annotations = annotation_patch(report)["metadata"]["annotations"]
    assert set(annotations) == set(SIDECAR_ANNOTATIONS)
    assert annotations[ANNOTATION_SNAPSHOT] == "s-4"
    assert annotations[ANNOTATION_TARGET] == "s-5"
    assert annotations[ANNOTATION_STATE] == "Loading"
    assert annotations[ANNOTATION_VIA] == "delta"
    assert annotations[ANNOTATION_SINCE] == "2026-11-23T09:45:12Z"


def test_a_retry_says_why_and_ready_removes_the_reason() -> None:
    """Issue 22: a bucket outage showed only in the sidecar's /status. Loading while it
    retries, the pod names the transient reason; at the target, none."""
    loading = PodAnnotations(
        "s-4", "s-5", ReplicaState.LOADING, MOMENT, reason="StorageUnavailable", message="x"
    )
    ready = PodAnnotations("s-5", "s-5", ReplicaState.READY, MOMENT, reason="NotFound")
    assert (loading.values()[ANNOTATION_REASON], loading.values()[ANNOTATION_MESSAGE]) == (
        "StorageUnavailable", "x"
    )  # fmt: skip
    assert ready.values()[ANNOTATION_REASON] is None
    assert ready.values()[ANNOTATION_MESSAGE] is None
    assert loading.values()[ANNOTATION_FAILED_SNAPSHOT] is None, "no snapshot is blamed"


def test_failed_report_carries_reason_and_a_bounded_message() -> None:
    failed = PodAnnotations(
        "s-4",
        "s-5",
        ReplicaState.FAILED,
        MOMENT,
        LoadPath.DELTA,
        reason=reasons.CHECKSUM_MISMATCH,
        message="m" * (MESSAGE_LIMIT * 3),
    )
    values = failed.values()
    assert values[ANNOTATION_REASON] == "ChecksumMismatch"
    assert values[ANNOTATION_MESSAGE] == "m" * MESSAGE_LIMIT


def test_a_new_time_alone_is_not_a_new_transition() -> None:
    first = PodAnnotations("s-4", "s-5", ReplicaState.LOADING, MOMENT)
    later = PodAnnotations("s-4", "s-5", ReplicaState.LOADING, datetime.now(UTC))
    assert later.same_content(first)
    assert not PodAnnotations("s-5", "s-5", ReplicaState.READY, MOMENT).same_content(first)


def test_gate_is_false_until_the_first_verified_load() -> None:
    gate = readiness_gate(None, None, 5, None)
    assert not gate.ready and gate.reason == reasons.NOT_LOADED


def test_gate_stays_true_while_behind_the_target_without_max_stale() -> None:
    gate = readiness_gate(3, "s-3", 40, None)
    assert gate.ready and gate.reason == reasons.VERIFIED


def test_gate_is_the_same_condition_for_every_verified_snapshot() -> None:
    # A delta changes the annotations only: no pods/status write per replica per snapshot.
    assert readiness_gate(3, "s-3", 4, None) == readiness_gate(4, "s-4", 4, None)
    assert readiness_gate(4, "s-4", 4, 2) == readiness_gate(5, "s-5", 6, 2)


def test_gate_turns_false_when_more_than_max_stale_steps_behind() -> None:
    assert readiness_gate(3, "s-3", 5, 2).ready
    stale = readiness_gate(3, "s-3", 6, 2)
    assert not stale.ready and stale.reason == reasons.STALE
    assert "3 steps behind" in stale.message


def test_condition_patch_carries_only_our_condition_type() -> None:
    patch = condition_patch(readiness_gate(3, "s-3", 3, None), MOMENT)
    conditions = patch["status"]["conditions"]
    assert [c["type"] for c in conditions] == [CONDITION_SNAPSHOT_READY]
    assert conditions[0]["status"] == "True"
    assert conditions[0]["lastTransitionTime"] == "2026-11-23T09:45:12Z"
    assert set(patch) == {"status"} and set(patch["status"]) == {"conditions"}


def test_the_report_carries_the_digest_verified_of_what_the_engine_serves() -> None:
    """Would catch (issue 22, finding 3): a report the operator cannot check against the
    snapshot (no digest where the engine gave one), or a digest left without a snapshot."""
    serving = PodAnnotations(
        "s-4", "s-4", ReplicaState.READY, MOMENT, LoadPath.DELTA, digest="ab" * 16
    )
    assert serving.values()[ANNOTATION_DIGEST] == "ab" * 16
    nothing = PodAnnotations(None, "s-4", ReplicaState.LOADING, MOMENT, digest="ab" * 16)
    assert nothing.values()[ANNOTATION_DIGEST] is None  # no snapshot, no digest
    unchecked = PodAnnotations("s-4", "s-4", ReplicaState.READY, MOMENT, LoadPath.FULL)
    assert unchecked.values()[ANNOTATION_DIGEST] is None  # the engine gives none: removed


def test_the_values_handed_out_are_copies_a_caller_may_change() -> None:
    """The values are computed once per report (an agent compares them on every pass);
    a caller that edits what it got (``same_content`` drops ``since``) changes no other."""
    report = PodAnnotations("s-4", "s-5", ReplicaState.LOADING, MOMENT, LoadPath.DELTA)
    first = report.values()
    first.pop(ANNOTATION_SINCE)
    first[ANNOTATION_STATE] = "Ready"
    again = report.values()
    assert again[ANNOTATION_SINCE] == "2026-11-23T09:45:12Z"
    assert again[ANNOTATION_STATE] == "Loading"
    later = PodAnnotations(
        "s-4", "s-5", ReplicaState.LOADING, MOMENT.replace(hour=10), LoadPath.DELTA
    )
    assert report.same_content(later)
    assert report.values() == again
