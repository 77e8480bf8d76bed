"""Run the operator in this process: kopf's reactor, our reconcilers, our endpoints.

The ``hotload operator`` shell builds :class:`OperatorOptions` from its flags and the
pod's environment and calls :func:`run_operator`; nothing below it reads ``os.environ``
except kopf's own login (``KUBECONFIG``, else the in-cluster service account).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import kopf
from kubernetes_asyncio.client import ApiClient

from hotload.kube import async_api_client
from hotload.operator.endpoints import start_endpoints
from hotload.operator.executor import KubeExecutor
from hotload.operator.fencing import Leadership, Standalone
from hotload.operator.fleet import Fleet
from hotload.operator.handlers import build_registry
from hotload.operator.lease import LeaderLease, LeaseTiming, incarnation_identity
from hotload.operator.metrics import OperatorMetrics
from hotload.operator.options import OperatorOptions
from hotload.operator.reconciler import ReconcileTiming
from hotload.operator.workload import SIDECAR_CLUSTER_ROLE

log = logging.getLogger(__name__)

#: Attributes kopf adds to its records that are not for humans (its whole settings object).
_KOPF_NOISE = ("settings", "k8s_skip")


class _KopfRecordFilter(logging.Filter):
    """Keep kopf's records to what matters: the object they are about, not its settings."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in _KOPF_NOISE:
            record.__dict__.pop(name, None)
        ref = record.__dict__.pop("k8s_ref", None)
        if isinstance(ref, dict):
            record.__dict__["object"] = (
                f"{ref.get('kind')}/{ref.get('namespace')}/{ref.get('name')}"
            )
        return True


def quiet_kopf_logs() -> None:
    """kopf logs every handler call at INFO: keep its object logs to warnings, its own lean."""
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _KopfRecordFilter) for f in handler.filters):
            handler.addFilter(_KopfRecordFilter())


async def operate(
    options: OperatorOptions,
    kubeconfig: Path | None,
    *,
    timing: ReconcileTiming | None = None,
    stop_flag: asyncio.Event | None = None,
    lease_timing: LeaseTiming | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Run until stopped (SIGTERM/SIGINT, or ``stop_flag``)."""
    quiet_kopf_logs()
    metrics = OperatorMetrics()
    identity = options.identity or "hotload-operator"

    async def connect() -> ApiClient:
        return await async_api_client(kubeconfig, environ=environ)

    executor = KubeExecutor(await connect(), metrics, identity, connect)
    fleet = Fleet(executor, metrics, timing or ReconcileTiming(), SIDECAR_CLUSTER_ROLE)
    lease: LeaderLease | None = None
    leadership: Leadership = Standalone()
    if options.lease:
        lease = LeaderLease(
            lambda: executor.api,
            options.lease_namespace,
            options.lease,
            incarnation_identity(identity),
            lease_timing,
            on_change=fleet.leadership_changed,
        )
        leadership = lease
    executor.leadership = leadership
    fleet.leadership_changed(leadership.leading)
    registry = build_registry(fleet, options)
    endpoints = await start_endpoints(
        options.host, options.port, metrics, fleet.reconciling, lambda: leadership.leading
    )
    log.info(
        "operator starting",
        extra={
            "namespaces": list(options.namespaces) or "all",
            "lease": f"{options.lease_namespace}/{options.lease}" if options.lease else None,
            "peering": options.peering or ("standalone" if options.kopf_standalone else "auto"),
            "priority": options.priority,
            "identity": lease.identity if lease is not None else identity,
            "endpoints": f"{options.host or '0.0.0.0'}:{options.port}",
        },
    )
    holding = asyncio.create_task(lease.run(), name="leader lease") if lease else None
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=options.cluster_wide,
            namespaces=list(options.namespaces),
            standalone=True if options.kopf_standalone else None,
            peering_name=options.peering,
            priority=options.priority,
            identity=cast(Any, options.identity),
            stop_flag=stop_flag,
        )
    finally:
        if holding is not None and lease is not None:
            holding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holding
            await lease.release()  # the standby takes over at once
        await endpoints.cleanup()
        await executor.close()
        log.info("operator stopped")


def run_operator(
    options: OperatorOptions, kubeconfig: Path | None, *, environ: Mapping[str, str] | None = None
) -> None:
    """Run the operator; ``environ`` names the proxy to the API server, if any
    (:func:`hotload.kube.client.proxy_for`)."""
    asyncio.run(operate(options, kubeconfig, environ=environ))
