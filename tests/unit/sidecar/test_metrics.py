"""Metrics live on the agent's own registry: many agents share a process without clashes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from hotload.sidecar.metrics import AgentMetrics


def test_two_agents_in_one_process_each_have_their_own_metrics() -> None:
    first, second = AgentMetrics(CollectorRegistry()), AgentMetrics(CollectorRegistry())
    first.fetched_bytes.inc(10)
    assert second.registry.get_sample_value("hotload_fetched_bytes_total") == 0


def test_exposition_names_follow_the_conventions() -> None:
    metrics = AgentMetrics(CollectorRegistry())
    metrics.set_served("s-3", 3, "Incremental")
    metrics.failures.labels(reason="ChecksumMismatch").inc()
    metrics.phase_seconds.labels(phase="rebuild").observe(0.2)
    text = generate_latest(metrics.registry).decode()
    for name in (
        "hotload_fetched_bytes_total",
        'hotload_phase_seconds_bucket{le="0.25",phase="rebuild"} 1.0',
        'hotload_failures_total{reason="ChecksumMismatch"} 1.0',
        'hotload_snapshot_info{identity="s-3",kind="Incremental",step="3"} 1.0',
        "hotload_held_requests 0.0",
        "hotload_requests_too_early_total",
    ):
        assert name in text


def test_the_info_metric_names_only_the_snapshot_served_now() -> None:
    metrics = AgentMetrics(CollectorRegistry())
    metrics.set_served("s-3", 3, "Incremental")
    metrics.set_served("s-4", 4, "Full")
    text = generate_latest(metrics.registry).decode()
    assert 'identity="s-4"' in text and 'identity="s-3"' not in text
    assert metrics.registry.get_sample_value("hotload_served_step") == 4
