"""The agent's Prometheus metrics, registered on the registry it was given.

Never the default registry: many agents may share one process (the pod runtime's shared
mode), each with its own :class:`~prometheus_client.CollectorRegistry`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hotload.api.kinds import Identity

#: Phases of one load, as the ``phase`` label spells them.
PHASES = ("fetch", "verify", "rebuild", "swap")

_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class AgentMetrics:
    """Every metric of one agent."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.fetched_bytes = Counter(
            "hotload_fetched_bytes",
            "Bytes read from the bucket (resumed bytes are not read again).",
            registry=registry,
        )
        self.phase_seconds = Histogram(
            "hotload_phase_seconds",
            "Seconds spent per load phase.",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "hotload_failures",
            "Load attempts that failed, by reason (transient ones included).",
            ["reason"],
            registry=registry,
        )
        self.swaps = Counter(
            "hotload_swaps",
            "Snapshots swapped into the engine, by how they were reached.",
            ["via"],
            registry=registry,
        )
        self.snapshot_info = Gauge(
            "hotload_snapshot_info",
            "The snapshot this replica serves (value 1).",
            ["identity", "step", "kind"],
            registry=registry,
        )
        self.served_step = Gauge(
            "hotload_served_step", "Step of the snapshot served now.", registry=registry
        )
        self.target_step = Gauge(
            "hotload_target_step", "Step of the deployment's target snapshot.", registry=registry
        )
        self.held_requests = Gauge(
            "hotload_held_requests",
            "Requests held by the front right now while a swap runs (ASYNC).",
            registry=registry,
        )
        self.held_requests_total = Counter(
            "hotload_requests_held",
            "Requests the front held during swaps (ASYNC).",
            registry=registry,
        )
        self.refused_requests = Counter(
            "hotload_requests_too_early",
            "Requests answered 425 Too Early during a swap (SYNC).",
            registry=registry,
        )
        self.proxied_requests = Counter(
            "hotload_proxied_requests",
            "Requests the front passed to the engine, by HTTP status.",
            ["status"],
            registry=registry,
        )
        for phase in PHASES:
            self.phase_seconds.labels(phase=phase)

    def clear_served(self) -> None:
        """Nothing verified is served (the engine restarted, or lost its weights)."""
        self.snapshot_info.clear()

    def set_served(self, identity: Identity, step: int, kind: str) -> None:
        """Point the info metric at the snapshot served now (one label set at a time)."""
        self.snapshot_info.clear()
        self.snapshot_info.labels(identity=identity, step=str(step), kind=kind).set(1)
        self.served_step.set(step)
