"""The operator's Prometheus metrics, on an explicit registry (no process-wide default).

Names start with ``hotload_operator_`` (CONTRACTS.md, "Operator endpoints"); ``/metrics``
on port 8080 serves them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Apply → all replicas ready: sub-second at small scale, tens of seconds for a Full at 1,000.
PROPAGATION_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 300, 600)
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.reconcile_seconds = Histogram(
            "hotload_operator_reconcile_seconds",
            "Time one reconcile of a RolloutDeployment took (plan and writes).",
            ["namespace", "deployment"],
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "hotload_operator_reconcile_errors_total",
            "Reconciles that failed (retried with backoff), by error reason.",
            ["namespace", "deployment", "reason"],
            registry=self.registry,
        )
        self.propagation_seconds = Histogram(
            "hotload_operator_propagation_seconds",
            "From a PolicySnapshot's creation to every desired replica serving it or newer.",
            ["namespace", "deployment"],
            buckets=PROPAGATION_BUCKETS,
            registry=self.registry,
        )
        self.replicas = Gauge(
            "hotload_operator_replicas",
            "Desired replicas by the state their sidecar reports (Pending: none yet).",
            ["namespace", "deployment", "state"],
            registry=self.registry,
        )
        self.status_writes = Counter(
            "hotload_operator_status_writes_total",
            "Status patches written, by kind (RolloutDeployment, PolicySnapshot).",
            ["kind"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "hotload_operator_api_requests_total",
            "Requests the reconcilers sent to the API server (kopf's watches not included).",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.events = Counter(
            "hotload_operator_events_total",
            "Kubernetes Events emitted, by reason.",
            ["type", "reason"],
            registry=self.registry,
        )
        self.reconcilers = Gauge(
            "hotload_operator_reconcilers",
            "RolloutDeployments this replica reconciles now (0 on a standby).",
            registry=self.registry,
        )
        self.leader = Gauge(
            "hotload_operator_leader",
            "1 while this replica holds the region's leader Lease (or runs alone), else 0.",
            registry=self.registry,
        )

    def set_replicas(self, namespace: str, deployment: str, by_state: Mapping[str, int]) -> None:
        for state in ("Pending", "Loading", "Ready", "Failed"):
            self.replicas.labels(namespace, deployment, state).set(by_state.get(state, 0))

    def forget(self, namespace: str, deployment: str) -> None:
        """Drop a deleted deployment's series."""
        for state in ("Pending", "Loading", "Ready", "Failed"):
            with contextlib.suppress(KeyError):
                self.replicas.remove(namespace, deployment, state)
