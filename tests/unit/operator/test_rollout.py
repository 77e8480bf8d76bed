"""Chain validity and target moves, as tables (docs/contracts.md, "The operator's rules")."""

from __future__ import annotations

import pytest

from hotload.api import ConditionStatus, KvCachePolicy, SnapshotKind, SnapshotRef
from hotload.operator.rollout import (
    BreakReport,
    ChainVerdict,
    SnapshotInfo,
    TargetMove,
    breaks_ahead_of,
    plan_target,
    validate_chains,
)
from tests.unit.operator.builders import broken, by_identity, delta, full, valid

T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


@pytest.mark.parametrize(
    ("snapshots", "expected"),
    [
        pytest.param([full("s0", 0)], {"s0": T}, id="a Full starts a chain"),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1")],
            {"s0": T, "s1": T, "s2": T},
            id="deltas reach a Full",
        ),
        pytest.param(
            [delta("s2", 2, "s1")], {"s2": U}, id="previous not applied yet: Unknown, never a break"
        ),
        pytest.param(
            [delta("s1", 1, "s0"), delta("s2", 2, "s1")],
            {"s1": U, "s2": U},
            id="a missing link leaves the whole rest Unknown",
        ),
        pytest.param(
            [full("s0", 0, deployment="other"), delta("s1", 1, "s0")],
            {"s0": T, "s1": F},
            id="previous of another deployment breaks the chain",
        ),
        pytest.param(
            [full("s0", 5), delta("s1", 5, "s0")],
            {"s0": T, "s1": F},
            id="a delta must come strictly after its previous (a Full outranks it at equal step)",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0", compression_format="zip/v9")],
            {"s0": T, "s1": F},
            id="an unsupported compression format is ManifestInvalid",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0", checksum_format="md5")],
            {"s0": T, "s1": F},
            id="an unsupported checksum format is ManifestInvalid",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0", checksum_format="adler32")],
            {"s0": T, "s1": T},
            id="adler32 is accepted",
        ),
        pytest.param(
            [full("s0", 0), delta("s1", 1, "s0", recorded=broken()), delta("s2", 2, "s1")],
            {"s0": T, "s1": F, "s2": F},
            id="a recorded break never heals and breaks what builds on it",
        ),
        pytest.param(
            [delta("s5", 5, "s4", recorded=valid())],
            {"s5": T},
            id="a valid verdict survives retention deleting its previous",
        ),
    ],
)
def test_chain_verdicts(
    snapshots: list[SnapshotInfo], expected: dict[str, ConditionStatus]
) -> None:
    verdicts = validate_chains(by_identity(*snapshots))
    assert {name: v.status for name, v in verdicts.items()} == expected


def test_reported_break_marks_the_named_snapshot_and_everything_after_it() -> None:
    snapshots = by_identity(full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"))
    report = BreakReport("s1", "ChecksumMismatch", "sha256 of a.safetensors differs", "demo-0")
    verdicts = validate_chains(snapshots, [report])
    assert verdicts["s0"].valid
    assert verdicts["s1"] == ChainVerdict(
        F, "ChecksumMismatch", "replica demo-0: sha256 of a.safetensors differs"
    )
    assert verdicts["s2"].broken and verdicts["s2"].reason == "ChainBroken"


def test_missing_previous_arrives_later_and_the_chain_becomes_valid() -> None:
    late = by_identity(delta("s1", 1, "s0"))
    assert validate_chains(late)["s1"].status is U
    late["s0"] = full("s0", 0)
    assert validate_chains(late)["s1"].status is T


def ref(identity: str, step: int, kind: SnapshotKind = SnapshotKind.INCREMENTAL) -> SnapshotRef:
    return SnapshotRef(identity=identity, step=step, kind=kind, kv_cache_policy=KvCachePolicy.ALL)


def _plan(
    infos: list[SnapshotInfo], observed: SnapshotRef | None, reports: list[BreakReport]
) -> tuple[str | None, TargetMove]:
    snapshots = by_identity(*infos)
    verdicts = validate_chains(snapshots, reports)
    plan = plan_target(snapshots, verdicts, "demo", observed, KvCachePolicy.ALL)
    return (plan.target.identity if plan.target else None), plan.move


CHAIN = [full("s0", 0), delta("s1", 1, "s0"), delta("s2", 2, "s1"), delta("s3", 3, "s2")]


@pytest.mark.parametrize(
    ("infos", "observed", "reports", "expected"),
    [
        pytest.param([], None, [], (None, TargetMove.NONE), id="nothing to target"),
        pytest.param(CHAIN, None, [], ("s3", TargetMove.FORWARD), id="first target: newest valid"),
        pytest.param(
            CHAIN,
            ref("s1", 1),
            [],
            ("s3", TargetMove.FORWARD),
            id="skips steps a fast trainer made",
        ),
        pytest.param(CHAIN, ref("s3", 3), [], ("s3", TargetMove.NONE), id="at the newest: stays"),
        pytest.param(
            [*CHAIN, delta("s5", 5, "s4")],
            ref("s3", 3),
            [],
            ("s3", TargetMove.NONE),
            id="never onto an Unknown (previous missing) snapshot",
        ),
        pytest.param(
            CHAIN,
            ref("s1", 1),
            [BreakReport("s2", "ChecksumMismatch", "", "demo-0")],
            ("s1", TargetMove.NONE),
            id="never onto or past a break",
        ),
        pytest.param(
            [*CHAIN, full("s4", 4), delta("s5", 5, "s4")],
            ref("s1", 1),
            [BreakReport("s2", "ChecksumMismatch", "", "demo-0")],
            ("s5", TargetMove.FORWARD),
            id="the next Full resets the chain",
        ),
        pytest.param(
            CHAIN,
            ref("s3", 3),
            [BreakReport("s3", "DecodeFailed", "", "demo-1")],
            ("s2", TargetMove.BACK),
            id="the target itself broken: back to the newest valid (the one backward move)",
        ),
        pytest.param(
            [full("s0", 0)],
            ref("s0", 0, SnapshotKind.FULL),
            [BreakReport("s0", "ChecksumMismatch", "", "demo-1")],
            ("s0", TargetMove.NONE),
            id="a broken target with nothing valid to return to is held",
        ),
        pytest.param(
            [*CHAIN[:3], full("s3", 3), delta("s3d", 3, "s2")],
            ref("s2", 2),
            [],
            ("s3", TargetMove.FORWARD),
            id="at equal steps a Full outranks a delta",
        ),
        pytest.param(
            CHAIN,
            ref("bogus", 9),
            [],
            ("s3", TargetMove.BACK),
            id="another writer's bogus target is repaired",
        ),
        pytest.param(
            [full("x0", 0, deployment="other")],
            ref("x0", 0, SnapshotKind.FULL),
            [],
            (None, TargetMove.BACK),
            id="another deployment's snapshot is never our target",
        ),
        pytest.param(
            CHAIN,
            ref("s3", 7),
            [],
            ("s3", TargetMove.REFRESH),
            id="a target ref edited by another writer is repaired",
        ),
    ],
)
def test_target_moves(
    infos: list[SnapshotInfo],
    observed: SnapshotRef | None,
    reports: list[BreakReport],
    expected: tuple[str | None, TargetMove],
) -> None:
    assert _plan(infos, observed, reports) == expected


def test_breaks_ahead_of_the_target_are_newest_first() -> None:
    snapshots = by_identity(
        full("s0", 0),
        delta("s1", 1, "s0", recorded=broken()),
        delta("s2", 2, "s1"),
    )
    verdicts = validate_chains(snapshots)
    ahead = breaks_ahead_of(snapshots.values(), verdicts, "demo", ref("s0", 0, SnapshotKind.FULL))
    assert [info.identity for info in ahead] == ["s2", "s1"]
    assert breaks_ahead_of(snapshots.values(), verdicts, "demo", ref("s2", 2)) == []


def test_resolved_cache_policy_comes_from_the_snapshot_else_the_deployment() -> None:
    own = full("s0", 0, kv_cache_policy=KvCachePolicy.NONE)
    plan = plan_target(by_identity(own), validate_chains(by_identity(own)), "demo", None,
                       KvCachePolicy.NEW_SESSION)  # fmt: skip
    assert plan.target is not None and plan.target.kv_cache_policy is KvCachePolicy.NONE
    plain = full("s0", 0)
    plan = plan_target(by_identity(plain), validate_chains(by_identity(plain)), "demo", None,
                       KvCachePolicy.NEW_SESSION)  # fmt: skip
    assert plan.target is not None and plan.target.kv_cache_policy is KvCachePolicy.NEW_SESSION


def test_chain_verdict_flags() -> None:
    assert ChainVerdict(T, "x", "").valid and not ChainVerdict(T, "x", "").broken
    assert ChainVerdict(F, "x", "").broken
    assert not ChainVerdict(U, "x", "").valid and not ChainVerdict(U, "x", "").broken


def test_every_format_the_sidecar_reads_is_accepted_as_declared() -> None:
    from hotload.snapshot.manifest import FORMATS

    assert set(FORMATS) == {f"hotload-delta/v{n}" for n in (1, 2, 3, 4, 5)}
    for declared in FORMATS:
        snapshots = by_identity(full("s0", 0), delta("s1", 1, "s0", compression_format=declared))
        assert validate_chains(snapshots)["s1"].valid, declared
