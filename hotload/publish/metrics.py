"""The publisher's Prometheus metrics, in the registry its caller gives (a trainer that
serves ``/metrics`` passes its own; nothing is registered globally).

- ``hotload_publisher_snapshots_total{kind}``: snapshots published (the fallback Full too);
- ``hotload_publisher_skipped_steps_total``: steps handed to ``publish`` and replaced by a
  newer one before they started (the publisher was behind the trainer);
- ``hotload_publisher_blocked_seconds``: how long each ``publish`` call held the training
  loop (the host copy);
- ``hotload_publisher_offered_step`` / ``hotload_publisher_published_step``: the newest
  step handed to ``publish`` and the newest one published (their difference is how far
  behind the publisher is, in steps);
- ``hotload_publisher_checkpoints_total{outcome}``: checkpoints beside the chain that
  ended ``complete`` or ``failed`` (a failed one is tried again);
- ``hotload_publisher_checkpoint_step``: the step of the newest complete checkpoint.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hotload.publish.results import PublishResult

#: From a host copy of a small model (milliseconds) to a stalled trainer (minutes).
BLOCKED_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)


class PublisherMetrics:
    """One publisher's metrics (see the module doc)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        name = "hotload_publisher_"
        self.snapshots = Counter(
            f"{name}snapshots", "Snapshots published, by kind.", ["kind"], registry=registry
        )
        self.skipped_steps = Counter(
            f"{name}skipped_steps", "Steps replaced by a newer one (behind).", registry=registry
        )
        self.blocked_seconds = Histogram(
            f"{name}blocked_seconds",
            "Seconds each publish call held the training loop.",
            buckets=BLOCKED_BUCKETS,
            registry=registry,
        )
        self.offered_step = Gauge(f"{name}offered_step", "Newest step offered.", registry=registry)
        self.published_step = Gauge(
            f"{name}published_step", "Newest step published.", registry=registry
        )
        self.checkpoints = Counter(
            f"{name}checkpoints",
            "Checkpoints beside the chain that ended, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.checkpoint_step = Gauge(
            f"{name}checkpoint_step", "Step of the newest complete checkpoint.", registry=registry
        )

    def offered(self, step: int) -> None:
        self.offered_step.set(step)

    def blocked(self, seconds: float) -> None:
        self.blocked_seconds.observe(seconds)

    def published(self, result: PublishResult) -> None:
        self.snapshots.labels(kind=result.kind.value).inc()
        self.skipped_steps.inc(len(result.skipped_steps))
        self.published_step.set(result.step)
        for ended in result.checkpoint_done:
            self.checkpoints.labels(outcome="complete" if ended.complete else "failed").inc()
            if ended.complete:
                self.checkpoint_step.set(ended.step)
