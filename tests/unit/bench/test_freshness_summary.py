"""bench/freshness's summaries: lag percentiles and the fate of the delta runs' scheduled
Fulls (a checkpoint beside the chain, or a Full in it), as results.md reports them.

Would catch: a checkpoint's completion timed from the wrong start, the steps published
while it was on its way miscounted (the one that took its outcome included, or a failed
attempt ending the count), a checkpoint still on its way reported complete, a Full in
the chain credited with no steps skipped behind it, a report that drops the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.freshness.report import report
from bench.freshness.summary import (
    Sample,
    lag_summary,
    published_entry,
    scheduled_full_row,
    scheduled_fulls,
    summarize_run,
)
from hotload.api import SnapshotKind
from hotload.publish.results import CheckpointResult, PublishResult, RegionOutcome, RegionResult

REGIONS = ["us-east", "eu-west"]


def entry(step: int, kind: str = "Incremental", **extra: Any) -> dict[str, Any]:
    """A published step as results.json keeps it (``published_entry``'s keys)."""
    return {
        "identity": f"r-step-{step}" + ("-full" if kind == "Full" else ""),
        "step": step,
        "kind": kind,
        "why": "delta",
        "stored_bytes": 6_000_000 if kind == "Full" else 40_000,
        "blocked_ms": 1.0,
        "encode_s": 0.1,
        "seconds": 2.0,
        "called_s": 5.0 * step,
        "skipped_steps": [],
        "outcomes": dict.fromkeys(REGIONS, "Applied"),
        "checkpoint": None,
        "checkpoint_begun": None,
        "checkpoint_done": [],
        **extra,
    }


def done(step: int, *, complete: bool, seconds: float, error: str | None = None) -> dict[str, Any]:
    return {
        "identity": f"r-step-{step}-checkpoint",
        "of": f"r-step-{step}",
        "step": step,
        "complete": complete,
        "error": error,
        "stored_bytes": 6_200_000 if complete else 0,
        "seconds": seconds,
    }


CKPT = "r-step-3-checkpoint"


def test_a_checkpoint_is_timed_from_its_lane_start_and_counts_the_deltas_meanwhile() -> None:
    published = [
        entry(1),
        entry(2),
        entry(3, why="checkpoint", checkpoint_begun=CKPT),
        entry(4),
        entry(5),
        # The publish that takes the outcome names the checkpoint at once.
        entry(6, checkpoint=CKPT, checkpoint_done=[done(3, complete=True, seconds=20.0)]),
        entry(7, checkpoint=CKPT),
    ]
    (checkpoint,) = scheduled_fulls(published)["beside_the_chain"]
    assert checkpoint["step"] == 3
    assert checkpoint["begun_s"] == 17.0  # called at 15 s, its delta delivered 2 s later
    assert checkpoint["complete"] and checkpoint["complete_s"] == 37.0
    assert checkpoint["stored_bytes"] == 6_200_000 and checkpoint["attempts"] == 1
    assert checkpoint["published_while_on_its_way"] == [4, 5]
    assert checkpoint["first_named_by_step"] == 6
    assert checkpoint["reported_at_step"] == 6


def test_a_failed_attempt_is_counted_and_the_retry_timed_from_its_own_start() -> None:
    published = [
        entry(3, checkpoint_begun=CKPT),
        entry(4, checkpoint_done=[done(3, complete=False, seconds=4.0, error="OSError: x")]),
        entry(5),
        entry(6, checkpoint_done=[done(3, complete=True, seconds=10.0)]),
    ]
    fulls = scheduled_fulls(published)
    (checkpoint,) = fulls["beside_the_chain"]
    assert checkpoint["attempts"] == 2 and checkpoint["errors"] == ["OSError: x"]
    assert checkpoint["complete_s"] == 30.0  # the retry started at step 4's publish (20 s)
    assert checkpoint["published_while_on_its_way"] == [4, 5]
    row = scheduled_full_row(fulls)
    assert (row["begun"], row["completed"], row["failed_attempts"]) == (1, 1, 1)


def test_a_checkpoint_on_its_way_at_the_end_is_not_complete_and_keeps_every_later_step() -> None:
    published = [
        entry(3, checkpoint_begun=CKPT),
        entry(4),
        entry(5),
        entry(6, checkpoint_begun="r-step-6-checkpoint"),  # never: one at a time, but harmless
    ]
    beside = scheduled_fulls(published)["beside_the_chain"]
    assert [c["complete"] for c in beside] == [False, False]
    assert beside[0]["published_while_on_its_way"] == [4, 5, 6]
    row = scheduled_full_row(scheduled_fulls(published))
    assert row["where"] == "beside the chain"
    assert (row["completed"], row["on_its_way_at_end"], row["seconds_median"]) == (0, 2, None)


def test_checkpoints_seconds_are_summarized_as_median_and_max() -> None:
    published = [
        entry(3, checkpoint_begun=CKPT),
        entry(4, checkpoint_done=[done(3, complete=True, seconds=30.0)]),
        entry(6, checkpoint_begun="r-step-6-checkpoint"),
        entry(7),
        entry(8),
        entry(9, checkpoint_done=[done(6, complete=True, seconds=50.0)]),
    ]
    row = scheduled_full_row(scheduled_fulls(published))
    assert (row["begun"], row["completed"], row["on_its_way_at_end"]) == (2, 2, 0)
    assert (row["seconds_median"], row["seconds_max"]) == (50.0, 50.0)
    assert row["steps_meanwhile"] == 2  # 7 and 8; none between 3 and 4


def test_a_full_in_the_chain_counts_the_steps_skipped_behind_it() -> None:
    published = [
        entry(2),
        entry(3, "Full", why="cadence", seconds=60.0),
        entry(7, skipped_steps=[4, 5, 6]),
        entry(8),
    ]
    # Without call times (an older results.json) the skipped steps are all it can tell.
    fulls = scheduled_fulls(published)
    assert fulls["beside_the_chain"] == []
    (full,) = fulls["in_the_chain"]
    assert full["skipped_behind_it"] == [4, 5, 6] and full["complete"]
    assert full["held_behind_it"] is None
    row = scheduled_full_row(fulls)
    assert row["where"] == "in the chain"
    assert (row["begun"], row["completed"], row["steps_meanwhile"]) == (1, 1, 3)
    assert row["seconds_max"] == 60.0


def test_a_full_in_the_chain_holds_every_step_handed_over_while_it_is_on_its_way() -> None:
    # The Full of step 3 is called at 15 s and reaches its outcome at 35 s: steps 4-7
    # (called at 20, 25, 30 s and 35 s) were handed over meanwhile; 4 and 5 were skipped.
    published = [
        entry(3, "Full", why="cadence", seconds=20.0),
        entry(6, skipped_steps=[4, 5]),
        entry(7),
        entry(8),
    ]
    loop = [{"step": step, "called_s": 5.0 * step} for step in range(1, 9)]
    (full,) = scheduled_fulls(published, loop)["in_the_chain"]
    assert full["held_behind_it"] == [4, 5, 6]
    assert full["skipped_behind_it"] == [4, 5]
    assert scheduled_full_row(scheduled_fulls(published, loop))["steps_meanwhile"] == 3


def test_a_full_in_the_chain_that_a_region_did_not_take_is_not_complete() -> None:
    published = [entry(3, "Full", why="cadence", outcomes={"us-east": "Pending"})]
    (full,) = scheduled_fulls(published)["in_the_chain"]
    assert not full["complete"]


def test_lag_percentiles_per_region_and_overall() -> None:
    samples = [Sample("deltas", "us-east", float(i), 10, 10 - (i % 3), "x") for i in range(100)]
    summary = lag_summary(samples, failures=2)
    assert (summary["p50"], summary["p99"], summary["max"]) == (1, 2, 2)
    assert summary["failed_requests"] == 2
    assert summary["share_at_lag_0"] == 0.34
    assert lag_summary([], failures=1) == {"completions": 0, "failed_requests": 1}


def test_the_report_has_the_lag_table_and_each_delta_run_s_scheduled_fulls(
    tmp_path: Path,
) -> None:
    samples = [
        Sample("deltas", region, float(t), t // 5, t // 5, f"r-step-{t // 5}")
        for t in range(0, 40)
        for region in REGIONS
    ]
    runs = {
        "deltas": [
            entry(3, checkpoint_begun=CKPT),
            entry(4),
            entry(5, checkpoint=CKPT, checkpoint_done=[done(3, complete=True, seconds=20.0)]),
        ],
        "deltas-full-in-chain": [entry(3, "Full", why="cadence"), entry(6, skipped_steps=[4, 5])],
        "full-every-step": [entry(1, "Full", why="cadence"), entry(2, "Full", why="cadence")],
    }
    loop = [{"step": s, "train_s": 0.5, "blocked_s": 0.01, "called_s": 5.0 * s} for s in range(7)]
    results = {
        run: {**summarize_run(samples, [], published, REGIONS, loop), "load": {}}
        for run, published in runs.items()
    }
    meta = {
        "command": "python -m bench.freshness.run --steps 6",
        "date": "2026-01-01T00:00:00Z",
        "machine": "test",
        "model": "test",
        "wan": "200 KB/s each way, 25 ms one way, per region",
        "interval_s": 5.0,
        "replicas_per_region": 1,
        "full_every": 3,
        "run_settings": {
            "deltas": {"full_every": 3, "checkpoints": True},
            "deltas-full-in-chain": {"full_every": 3, "checkpoints": False},
            "full-every-step": {"full_every": 1, "checkpoints": False},
        },
    }
    report(meta, results, tmp_path)
    text = (tmp_path / "results.md").read_text()
    assert "| deltas | eu-west |" in text and "| full-every-step | all |" in text
    assert "a Full every 3 steps" in text
    assert "| deltas | beside the chain | 1 | 1 | 0 | 0 | 20.0 / 20.0 | 1 |" in text
    # The Full of step 3 (called at 15 s, 2 s to its outcome) held no step: none was called
    # before 17 s; steps 4-5 were skipped behind it all the same.
    assert "| deltas-full-in-chain | in the chain | 1 | 1 | 0 | 0 | 2.0 / 2.0 | 0 |" in text
    assert "| 6,000,000 | yes | none | 2 (4-5) |" in text
    assert f"| `{CKPT}` | 3 | 17.0 | 37.0 | 20.0 | 6,200,000 | 1 | 5 | 1 (4) |" in text
    assert "| full-every-step | in the chain" not in text  # not a delta run
    assert "`deltas`: a delta at every step; at the cadence's step" in text
    assert "## Reading this run" not in text  # another run's analysis stays out of a scratch report


def test_a_publish_result_is_kept_with_its_checkpoints() -> None:
    result = PublishResult(
        identity="r-step-6",
        step=6,
        kind=SnapshotKind.INCREMENTAL,
        previous="r-step-5",
        why="delta",
        stored_bytes=40_000,
        full_bytes=6_000_000,
        blocked_seconds=0.0123,
        encode_seconds=0.2,
        seconds=1.5,
        regions={"us-east": RegionResult(context="us-east", outcome=RegionOutcome.APPLIED)},
        checkpoint=CKPT,
        checkpoint_done=[
            CheckpointResult(
                identity=CKPT, of="r-step-3", step=3, complete=True, stored_bytes=9, seconds=2.5
            )
        ],
    )
    kept = published_entry(result, called_s=30.0)
    assert kept["outcomes"] == {"us-east": "Applied"} and kept["called_s"] == 30.0
    assert kept["checkpoint"] == CKPT and kept["checkpoint_begun"] is None
    assert kept["checkpoint_done"] == [done(3, complete=True, seconds=2.5) | {"stored_bytes": 9}]
    begun = entry(3, checkpoint_begun=CKPT)
    (checkpoint,) = scheduled_fulls([begun, kept])["beside_the_chain"]
    assert checkpoint["complete"] and checkpoint["first_named_by_step"] == 6
