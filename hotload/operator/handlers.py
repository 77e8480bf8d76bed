"""The kopf handlers: wiring only, every decision is in the planners.

- one daemon per RolloutDeployment runs its reconciler (kopf stops it on deletion, and
  keeps the finalizer ``hotload.dev/operator`` on the deployment while it runs). With the
  leader Lease (the chart), kopf runs on every replica and each reconciler waits for the
  Lease before it plans or writes; with kopf peering, daemons run on the peering leader;
- watch-event handlers for the deployments, their owned objects and the PolicySnapshots
  hand each body to the fleet, which pokes the reconciler concerned. Replica pods are
  watched by each reconciler itself (the shared ``hotload.kube.reflector``: kopf's
  per-event cost is too high for a thousand replicas).

The operator never writes pods; pods and owned objects are watched with a server-side
label selector, so the operator sees only replicas and objects it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

from hotload.api import GROUP, VERSION
from hotload.api.labels import (
    MANAGED_BY_LABEL,
    MANAGED_BY_OPERATOR,
    OPERATOR_ANNOTATION_PREFIX,
    OPERATOR_FINALIZER,
)
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.operator.fleet import Fleet
from hotload.operator.options import OperatorOptions

log = logging.getLogger(__name__)

#: A leader's peering record expires this long after its last keep-alive (a hard-killed
#: leader is replaced within it; a leader that exits cleanly withdraws its record at once).
PEERING_LIFETIME_S: Final = 15
MANAGED_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY_OPERATOR}"
#: Resources watched only with our label (core and apps/rbac plurals).
OWNED_RESOURCES: Final = (
    ("apps", "v1", "statefulsets"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)


def _event_type(event: Mapping[str, Any]) -> str | None:
    value = event.get("type")
    return str(value) if value else None


def configure_settings(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """kopf settings for our operator (applied in the startup handler)."""
    settings.posting.enabled = False  # our Events are our own, about our objects
    settings.persistence.finalizer = OPERATOR_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=OPERATOR_ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=OPERATOR_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.peering.lifetime = PEERING_LIFETIME_S
    settings.peering.stealth = True
    if not options.kopf_standalone:
        # Namespaces matching a glob come and go: one cluster-wide peering object, not one
        # per namespace (kopf would pause everything while a new namespace lacks its own).
        settings.peering.clusterwide = True
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    for _group, _version, plural in OWNED_RESOURCES:
        settings.watching.label_selectors[plural] = MANAGED_SELECTOR


def build_registry(fleet: Fleet, options: OperatorOptions) -> kopf.OperatorRegistry:
    """A registry with our handlers, bound to ``fleet`` (no module-level global state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings, options)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # KUBECONFIG when set (the local pod runtime's pod-bound token), else in-cluster.
        info = kopf.login_with_kubeconfig(**kwargs)
        return info if info is not None else kopf.login_with_service_account(**kwargs)

    @kopf.daemon(GROUP, VERSION, DEPLOYMENTS, registry=registry, cancellation_timeout=10.0)
    async def reconcile_deployment(
        stopped: kopf.DaemonStopped, body: kopf.Body, namespace: str | None, name: str, **_: Any
    ) -> None:
        namespace = namespace or ""
        reconciler = fleet.start(namespace, name)
        reconciler.on_deployment(dict(body))
        task = asyncio.create_task(reconciler.run(), name=f"reconcile {namespace}/{name}")
        try:
            await stopped.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            reason = stopped.reason or kopf.DaemonStoppingReason(0)
            deleted = bool(reason & kopf.DaemonStoppingReason.RESOURCE_DELETED)
            if deleted:
                await reconciler.release_guards()
            fleet.stop(reconciler, deleted=deleted)
            log.info("reconciler stopped", extra={"namespace": namespace, "deployment": name})

    @kopf.on.event(GROUP, VERSION, DEPLOYMENTS, registry=registry)
    async def deployment_changed(body: kopf.Body, **_: Any) -> None:
        fleet.deployment_event(body)

    @kopf.on.event(GROUP, VERSION, SNAPSHOTS, registry=registry)
    async def snapshot_changed(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
        fleet.snapshot_event(_event_type(event), body)

    for group, version, plural in OWNED_RESOURCES:

        @kopf.on.event(
            group,
            version,
            plural,
            labels={MANAGED_BY_LABEL: MANAGED_BY_OPERATOR},
            registry=registry,
        )
        async def owned_changed(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
            fleet.owned_event(_event_type(event), body)

    return registry
