"""The running reconcilers, and the routing of watch events to them.

kopf calls one handler per watch event; each handler only hands the body to the
reconciler(s) it concerns (an owned object to its deployment's, a PolicySnapshot to every
deployment's in its namespace) and returns; pods are watched by each reconciler itself.
Events for a deployment whose reconciler is not running (not started yet) are dropped: a
reconciler lists its view afresh whenever it starts to lead. Snapshots of a deployment
that has no reconciler at all are marked by :mod:`hotload.operator.orphans`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hotload.api.labels import INSTANCE_LABEL
from hotload.operator.executor import KubeExecutor
from hotload.operator.metrics import OperatorMetrics
from hotload.operator.orphans import OrphanWatch
from hotload.operator.reconciler import DeploymentReconciler, ReconcileTiming

Key = tuple[str, str]


def _labels(body: Mapping[str, Any]) -> Mapping[str, str]:
    return (body.get("metadata") or {}).get("labels") or {}


def _namespace(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("namespace") or "")


class Fleet:
    def __init__(
        self,
        executor: KubeExecutor,
        metrics: OperatorMetrics,
        timing: ReconcileTiming,
        sidecar_cluster_role: str,
    ) -> None:
        self.executor = executor
        self.metrics = metrics
        self.timing = timing
        self.sidecar_cluster_role = sidecar_cluster_role
        self._reconcilers: dict[Key, DeploymentReconciler] = {}
        self._leading = False
        self.orphans = OrphanWatch(executor, lambda ns, name: (ns, name) in self._reconcilers)

    def __len__(self) -> int:
        return len(self._reconcilers)

    def reconciling(self) -> int:
        """Deployments this replica reconciles now: all of them while it leads, else 0."""
        return len(self._reconcilers) if self._leading else 0

    def leadership_changed(self, leading: bool) -> None:
        """The leader Lease was gained or lost: wake every reconciler (to pause or to list
        afresh and plan) and say so in the metrics."""
        self._leading = leading
        self.metrics.leader.set(1 if leading else 0)
        self.metrics.reconcilers.set(self.reconciling())
        for reconciler in self._reconcilers.values():
            reconciler.wakeup.poke(urgent=True)

    def get(self, namespace: str, name: str) -> DeploymentReconciler | None:
        return self._reconcilers.get((namespace, name))

    def start(self, namespace: str, name: str) -> DeploymentReconciler:
        reconciler = DeploymentReconciler(
            namespace, name, self.executor, self.metrics, self.timing, self.sidecar_cluster_role
        )
        self._reconcilers[(namespace, name)] = reconciler
        self.metrics.reconcilers.set(self.reconciling())
        return reconciler

    def stop(self, reconciler: DeploymentReconciler, *, deleted: bool) -> None:
        key = (reconciler.namespace, reconciler.name)
        if self._reconcilers.get(key) is reconciler:
            del self._reconcilers[key]
        if deleted:
            self.metrics.forget(reconciler.namespace, reconciler.name)
        self.metrics.reconcilers.set(self.reconciling())

    def deployment_event(self, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        reconciler = self.get(_namespace(body), str(metadata.get("name") or ""))
        if reconciler is not None:
            reconciler.on_deployment(body)

    def owned_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        reconciler = self.get(_namespace(body), _labels(body).get(INSTANCE_LABEL, ""))
        if reconciler is not None:
            reconciler.on_owned(event_type, body)

    def snapshot_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        namespace = _namespace(body)
        for (reconciler_namespace, _), reconciler in list(self._reconcilers.items()):
            if reconciler_namespace == namespace:
                reconciler.on_snapshot(event_type, body)
        self.orphans.observe(event_type, body)
