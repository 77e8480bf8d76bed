"""What bench/freshness keeps of a run: lag percentiles, publish → serve seconds, and the
fate of each scheduled Full (a checkpoint beside the chain, or a Full in it).

Pure functions of the samples and of the publish results (as the dicts results.json
holds), so that they are tested without regions; the loop itself is in ``run.py``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hotload.publish.results import PublishResult

#: A served identity's step: ``<prefix>-step-<n>`` (a delta), ``…-full``, ``…-lora``.
STEP_PATTERN = re.compile(r"-step-(\d+)(?:-full|-lora|-checkpoint)?$")


@dataclass(frozen=True)
class Sample:
    run: str
    region: str
    sent: float
    """Seconds since the run's first publish."""
    newest_step: int
    served_step: int
    identity: str

    @property
    def lag(self) -> int:
        return max(0, self.newest_step - self.served_step)


def percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def lag_summary(samples: list[Sample], failures: int) -> dict[str, Any]:
    lags = [s.lag for s in samples]
    if not lags:
        return {"completions": 0, "failed_requests": failures}
    return {
        "completions": len(lags),
        "failed_requests": failures,
        "p50": percentile(lags, 0.50),
        "p99": percentile(lags, 0.99),
        "max": max(lags),
        "share_at_lag_0": round(sum(1 for lag in lags if lag == 0) / len(lags), 3),
    }


def summarize_run(
    samples: list[Sample],
    failures: list[str],
    published: list[dict[str, Any]],
    names: list[str],
    loop: list[dict[str, Any]],
) -> dict[str, Any]:
    """What results.json keeps of one run: percentiles, a histogram of the lags, per
    region the seconds from each step's publish to its first completion, the scheduled
    Fulls' fate, and the training loop's steps (the raw samples go, compressed, to
    results-samples.json.gz)."""
    as_dicts = [asdict(s) for s in samples]
    histogram: dict[str, int] = {}
    for sample in samples:
        histogram[str(sample.lag)] = histogram.get(str(sample.lag), 0) + 1
    return {
        "overall": lag_summary(samples, len(failures)),
        "by_region": {
            name: lag_summary([s for s in samples if s.region == name], failures.count(name))
            for name in names
        },
        "lag_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
        "serve_seconds": {name: serve_seconds(as_dicts, name) for name in names},
        "published": published,
        "scheduled_fulls": scheduled_fulls(published, loop),
        "training_loop": loop,
    }


def serve_seconds(samples: list[dict[str, Any]], region: str) -> list[float]:
    """Per step: seconds from its publish to the first request of ``region`` it served.

    Both ends come from the samples: the publish is the first request (any region) sent
    knowing the step (within one request's round, ~0.3 s, after the real publish), the
    serve the first request of the region that the step (or a newer one) answered.
    """
    steps = sorted({s["newest_step"] for s in samples})
    seconds = []
    for step in steps[1:]:  # the first was served before the clients started
        known = [s["sent"] for s in samples if s["newest_step"] >= step]
        served = [s["sent"] for s in samples if s["region"] == region and s["served_step"] >= step]
        if known and served:
            seconds.append(round(max(0.0, min(served) - min(known)), 3))
    return seconds


def published_entry(result: PublishResult, called_s: float | None) -> dict[str, Any]:
    """One published snapshot as results.json keeps it. ``called_s``: when the training
    loop called ``publish`` for its step, seconds since the run's first publish."""
    return {
        "identity": result.identity,
        "step": result.step,
        "kind": result.kind.value,
        "why": result.why,
        "stored_bytes": result.stored_bytes,
        "blocked_ms": round(result.blocked_seconds * 1000, 2),
        "encode_s": result.encode_seconds,
        "seconds": result.seconds,
        "called_s": called_s,
        "skipped_steps": result.skipped_steps,
        "outcomes": {c: r.outcome.value for c, r in result.regions.items()},
        "checkpoint": result.checkpoint,
        "checkpoint_begun": result.checkpoint_begun,
        "checkpoint_done": [done.model_dump(mode="json") for done in result.checkpoint_done],
    }


def scheduled_fulls(
    published: list[dict[str, Any]], loop: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The fate of the cadence's Fulls in one run, from its publish results in step order.

    Beside the chain (checkpoints): each checkpoint begun, when it was complete (its lane
    starts once its step's delta is delivered: ``called_s + seconds`` of that step; a
    retry starts at the publish that reported the failed attempt), its seconds and bytes,
    the first delta that named it, and the steps published while it was on its way (after
    its step, before the publish that took its outcome; all later steps if none did).
    In the chain (``why == "cadence"``): each Full's seconds from the publish call to every
    region's outcome, the steps the training loop handed over while it was on its way
    (from ``loop``'s call times, skipped steps included: each waited behind it or was
    skipped; None without call times) and the steps the publisher skipped behind it (the
    next result's).
    """
    called = {e["step"]: e["called_s"] for e in loop or [] if e.get("called_s") is not None}
    ordered = sorted(published, key=lambda p: p["step"])
    checkpoints: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(ordered):
        for done in entry.get("checkpoint_done") or []:
            record = checkpoints.get(done["identity"])
            if record is None or record["complete"]:
                continue  # begun before the loop (none in this bench), or reported twice
            record["attempts"] += 1
            if not done["complete"]:
                record["errors"].append(done.get("error"))
                record["lane_started_s"] = entry.get("called_s")
                continue
            record.update(
                complete=True,
                seconds=done["seconds"],
                stored_bytes=done["stored_bytes"],
                reported_at_step=entry["step"],
                complete_s=_plus(record["lane_started_s"], done["seconds"]),
            )
            record["published_while_on_its_way"] = [
                p["step"] for p in ordered[record["index"] + 1 : index]
            ]
        named = entry.get("checkpoint")
        if named in checkpoints and checkpoints[named]["first_named_by_step"] is None:
            checkpoints[named]["first_named_by_step"] = entry["step"]
        begun = entry.get("checkpoint_begun")
        if begun:
            started = _plus(entry.get("called_s"), entry.get("seconds"))
            checkpoints[begun] = {
                "identity": begun,
                "step": entry["step"],
                "index": index,
                "begun_s": started,
                "lane_started_s": started,
                "attempts": 0,
                "errors": [],
                "complete": False,
                "seconds": None,
                "stored_bytes": None,
                "reported_at_step": None,
                "complete_s": None,
                "first_named_by_step": None,
                "published_while_on_its_way": [p["step"] for p in ordered[index + 1 :]],
            }
    beside = [
        {k: v for k, v in record.items() if k not in ("index", "lane_started_s")}
        for record in checkpoints.values()
    ]
    in_chain = []
    for index, entry in enumerate(ordered):
        if entry["kind"] != "Full" or entry.get("why", "cadence") != "cadence":  # no why: older
            continue
        after = ordered[index + 1] if index + 1 < len(ordered) else None
        start = entry.get("called_s")
        held = None
        if called and start is not None:
            end = start + entry["seconds"]
            held = sorted(step for step, t in called.items() if step > entry["step"] and t < end)
        in_chain.append(
            {
                "identity": entry["identity"],
                "step": entry["step"],
                "seconds": entry["seconds"],
                "stored_bytes": entry["stored_bytes"],
                "complete": all(o in _DONE for o in entry["outcomes"].values()),
                "skipped_behind_it": list(after["skipped_steps"]) if after else [],
                "held_behind_it": held,
            }
        )
    return {"beside_the_chain": beside, "in_the_chain": in_chain}


#: Region outcomes that end a publish well (RegionOutcome.ok's values).
_DONE = frozenset({"Ready", "Superseded", "Applied"})


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a + b, 3)


def scheduled_full_row(fulls: dict[str, Any]) -> dict[str, Any]:
    """One run's scheduled Fulls in a line: where they went, how many began and completed,
    their seconds to complete (median / max), and the steps published (beside the chain)
    (beside the chain) or handed over (in it: each waited behind the Full, or was skipped;
    the skipped ones where call times are unknown) while one was on its way."""
    beside, in_chain = fulls["beside_the_chain"], fulls["in_the_chain"]
    if beside or not in_chain:
        seconds = [c["seconds"] for c in beside if c["complete"]]
        return {
            "where": "beside the chain",
            "begun": len(beside),
            "completed": len(seconds),
            "failed_attempts": sum(len(c["errors"]) for c in beside),
            "on_its_way_at_end": sum(1 for c in beside if not c["complete"]),
            "seconds_median": median(seconds) if seconds else None,
            "seconds_max": max(seconds, default=None),
            "steps_meanwhile": sum(len(c["published_while_on_its_way"]) for c in beside),
        }
    seconds = [f["seconds"] for f in in_chain if f["complete"]]
    return {
        "where": "in the chain",
        "begun": len(in_chain),
        "completed": len(seconds),
        "failed_attempts": sum(1 for f in in_chain if not f["complete"]),
        "on_its_way_at_end": 0,
        "seconds_median": median(seconds) if seconds else None,
        "seconds_max": max(seconds, default=None),
        "steps_meanwhile": sum(len(_held(f)) for f in in_chain),
    }


def _held(full: dict[str, Any]) -> list[int]:
    held = full.get("held_behind_it")
    return list(full["skipped_behind_it"]) if held is None else list(held)
