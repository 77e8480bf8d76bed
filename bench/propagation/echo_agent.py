"""A stand-in agent for the control-plane-only pass of bench/propagation (never a product path).

The benchmark's main pass runs the real sidecar agent in every replica. This agent isolates
what the operator and the apiserver cost at scale: it watches its deployment exactly as the
sidecar does (the same ``DeploymentWatcher``) and, as soon as the target changes, writes
the pod report the sidecar would write after a load that took no time (the same annotation
and condition patches, through the same ``PodWriter``). Apply → every replica "Ready" then
measures the operator, the apiserver and the watch fan-out, with the per-replica load cost
taken out. Selected with ``HOTLOAD_RUNTIME_AGENT_FACTORY=bench.propagation.echo_agent:run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from hotload.api import LoadPath, ReplicaState
from hotload.kube import async_api_client
from hotload.local.runtime.agent_factory import agent_config
from hotload.retry import RetryPolicy
from hotload.sidecar.deployment_watch import DeploymentView, DeploymentWatcher
from hotload.sidecar.pod_report import PodAnnotations, readiness_gate
from hotload.sidecar.pod_writer import PodWriter


async def run(env: Mapping[str, str], registry: CollectorRegistry) -> None:
    """Run one pod's echo agent until cancelled."""
    config = agent_config(env)
    api = await async_api_client(Path(env["KUBECONFIG"]), environ=env)
    writer = PodWriter(api, config.namespace, config.pod_name, RetryPolicy())
    changed = asyncio.Event()
    latest: list[DeploymentView] = []

    def on_change(view: DeploymentView) -> None:
        latest[:] = [view]
        changed.set()

    watcher = DeploymentWatcher(api, config.namespace, config.deployment, RetryPolicy(), on_change)
    watching = asyncio.create_task(watcher.run())
    writing = asyncio.create_task(writer.run())
    served: str | None = None
    try:
        while True:
            await changed.wait()
            changed.clear()
            deployment = latest[0].deployment if latest else None
            status = deployment.status if deployment is not None else None
            target = status.target_snapshot if status is not None else None
            if target is None or target.identity == served:
                continue
            served = target.identity
            now = datetime.now(UTC)
            writer.publish(
                PodAnnotations(served, served, ReplicaState.READY, now, LoadPath.DELTA),
                readiness_gate(target.step, served, target.step, None),
            )
    finally:
        for task in (watching, writing):
            task.cancel()
        await asyncio.gather(watching, writing, return_exceptions=True)
        await api.close()
