"""The freshness lag of ``hotload status`` / ``hotload ledger``: steps behind the newest
snapshot published for a deployment in *any* region, not only the region's own target.

Would catch: a region whose apiserver missed the newest snapshots looking up to date
(its own target is old too), a lag counted from another deployment's snapshots, and a
replica serving nothing shown as fresh.
"""

from __future__ import annotations

from typing import Any

from hotload.cli.fleet_view import (
    RegionObjects,
    deployment_rows,
    newest_steps,
    on_chain,
    replica_rows,
    sort_deployments,
    sort_replicas,
)
from tests.unit.operator.test_fleet_view import psnap, rd, replica


def other_deployments_snapshot(name: str, step: int) -> Any:
    body = psnap(name, step)
    body["spec"]["deploymentRef"] = {"name": "b"}
    return body


def regions() -> list[RegionObjects]:
    caught_up = RegionObjects(
        "east",
        [rd("a", target_step=5)],
        [psnap("s3", 3), psnap("s5", 5), other_deployments_snapshot("b9", 9)],
        [replica("a-0", "s5", "Ready"), replica("a-1", "s3", "Loading")],
    )
    # Its apiserver was down: it never got s5, so its target is s3 and it looks done.
    missed = RegionObjects(
        "west",
        [rd("a", target_step=3)],
        [psnap("s3", 3)],
        [replica("a-0", "s3", "Ready"), replica("a-1", None, "Loading")],
    )
    return [caught_up, missed]


def test_newest_step_is_per_deployment_across_regions() -> None:
    assert newest_steps(regions()) == {("ns", "a"): 5, ("ns", "b"): 9}


def test_a_region_that_missed_snapshots_shows_its_lag_even_at_its_target() -> None:
    east, west = regions()
    newest = newest_steps([east, west])
    west_rows = replica_rows(west, newest=newest)
    assert {(r.pod, r.behind, r.lag) for r in west_rows} == {("a-0", 0, 2), ("a-1", None, None)}
    east_rows = replica_rows(east, newest=newest)
    assert {(r.pod, r.behind, r.lag) for r in east_rows} == {("a-0", 0, 0), ("a-1", 2, 2)}


def test_a_deployment_lags_by_its_oldest_replica() -> None:
    east, west = regions()
    newest = newest_steps([east, west])
    (row_east,) = deployment_rows(east, newest)
    (row_west,) = deployment_rows(west, newest)
    assert (row_east.newest_step, row_east.lag) == (5, 2)
    assert (row_west.newest_step, row_west.lag) == (5, 2)


def test_without_other_regions_the_lag_is_unknown_not_zero() -> None:
    east, _ = regions()
    (row,) = deployment_rows(east)
    assert row.lag is None
    assert all(r.lag is None for r in replica_rows(east))


def test_a_region_that_missed_snapshots_comes_first_though_settled_on_its_target() -> None:
    """Would catch: laggards sorted by their region's own target only (west looks done)."""
    east = RegionObjects(
        "east",
        [rd("a", target_step=5)],
        [psnap("s3", 3), psnap("s5", 5)],
        [replica("a-0", "s5", "Ready"), replica("a-1", "s5", "Ready")],
    )
    _, west = regions()
    newest = newest_steps([east, west])
    rows = sort_deployments(row for r in (east, west) for row in deployment_rows(r, newest))
    assert [(r.region, r.lag) for r in rows] == [("west", 2), ("east", 0)]
    replicas = sort_replicas(row for r in (east, west) for row in replica_rows(r, newest=newest))
    # The replica at lag 2 (Ready on west's old target) before those at lag 0; the west
    # replica serving nothing (step unknown, not Ready) first of all.
    assert [(r.region, r.pod, r.lag) for r in replicas] == [
        ("west", "a-1", None),
        ("west", "a-0", 2),
        ("east", "a-0", 0),
        ("east", "a-1", 0),
    ]


def _linked(name: str, step: int, previous: str | None, chain_valid: str | None = None) -> Any:
    body = psnap(name, step)
    body["spec"]["kind"] = "Incremental" if previous else "Full"
    if previous:
        body["spec"]["incremental"] = {"previousIdentity": previous}
    if chain_valid:
        body["status"]["conditions"] = [{"type": "ChainValid", "status": chain_valid}]
    return body


def test_the_lag_counts_only_the_deployments_chain() -> None:
    """Issue 22: one orphan snapshot showed as a lag of 882 steps. A delta whose previous
    the region never saw, one past a break and a broken one are not the trainer's progress;
    a Full always is, and so is a delta whose chain reaches one."""
    snapshots = [
        _linked("s0-full", 0, None),
        _linked("s1", 1, "s0-full"),
        _linked("s2", 2, "s1", chain_valid="False"),
        _linked("s3", 3, "s2"),
        _linked("orphan", 882, "never-published"),
        _linked("loop-a", 900, "loop-b"),
        _linked("loop-b", 901, "loop-a"),
    ]
    region = RegionObjects(
        "east", [rd("a", target_step=1)], snapshots, [replica("a-0", "s1", "Ready")]
    )

    assert on_chain(snapshots) == {("ns", "s0-full"), ("ns", "s1")}
    assert newest_steps([region]) == {("ns", "a"): 1}
    (row,) = deployment_rows(region, newest_steps([region]))
    assert row.lag == 0

    fallback = _linked("s2-full", 2, None)
    healed = RegionObjects("east", region.deployments, [*snapshots, fallback], region.pods)
    assert newest_steps([healed]) == {("ns", "a"): 2}


def test_a_chain_cut_at_its_checkpoint_is_still_the_trainers_progress() -> None:
    """Retention deletes what is older than a checkpoint's snapshot: the deltas after it
    stay on the chain (a replica starts from the checkpoint); that snapshot, as a target of
    its own, would need its deleted previous."""
    s11 = _linked("s11", 11, "s10")
    s11["spec"]["incremental"]["checkpoint"] = {"identity": "s10-checkpoint", "of": "s10"}
    snapshots = [_linked("s10", 10, "s9-deleted"), s11, _linked("s12", 12, "s11")]
    for order in (snapshots, snapshots[::-1]):
        assert on_chain(order) == {("ns", "s11"), ("ns", "s12")}
    # Without the checkpoint the same objects are orphans.
    del s11["spec"]["incremental"]["checkpoint"]
    assert on_chain(snapshots) == set()


def test_why_replicas_are_not_at_the_target_shows_in_status_and_ledger() -> None:
    """A bucket outage, a full disk, a foreign pause: the pods' reasons, counted per
    deployment (`hotload status`) and per replica (`hotload ledger`), whatever the state
    but Ready."""
    region = RegionObjects(
        "east",
        [rd("a", target_step=5)],
        [psnap("s3", 3), psnap("s5", 5)],
        [
            replica("a-0", "s3", "Loading", reason="StorageUnavailable", message="bucket down"),
            replica("a-1", "s3", "Loading", reason="StorageUnavailable", message="bucket down"),
            replica("a-2", "s3", "Failed", reason="DiskFull", message="no space"),
            replica("a-3", "s5", "Ready", reason="StorageUnavailable"),
        ],
    )

    (row,) = deployment_rows(region)
    assert row.waiting == {"StorageUnavailable": 2, "DiskFull": 1}
    why = {r.pod: (r.reason, r.message) for r in replica_rows(region)}
    assert why == {
        "a-0": ("StorageUnavailable", "bucket down"),
        "a-1": ("StorageUnavailable", "bucket down"),
        "a-2": ("DiskFull", "no space"),
        "a-3": (None, None),
    }
