"""What a shared-mode host runs for each pod: the real sidecar agent, noop engine.

There is one agent (``hotload.sidecar.SidecarAgent``), never a second copy for tests
(CONTRACTS.md). Here it is built from the environment the pod's sidecar container
would have had (the pod contract's names, resolved by the runtime from the pod spec),
with ``serve_http`` off (a thousand fronts would not fit on two cores; probes are not
run for shared pods), its own Kubernetes client on its own pod-bound ``KUBECONFIG``,
the registry its host made for it, and a :class:`~hotload.engines.NoopEngine`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from hotload.errors import ConfigError
from hotload.sidecar import AgentConfig
from hotload.sidecar.config import config_from_pod_env


def agent_config(env: Mapping[str, str]) -> AgentConfig:
    """The agent's frozen config from a shared pod's sidecar environment (no HTTP)."""
    return config_from_pod_env(env, serve_http=False)


async def run_sidecar_agent(env: Mapping[str, str], registry: CollectorRegistry) -> None:
    """Run one pod's agent until cancelled."""
    from hotload.engines import NoopEngine
    from hotload.kube import async_api_client
    from hotload.sidecar import SidecarAgent

    config = agent_config(env)
    kubeconfig = env.get("KUBECONFIG")
    if not kubeconfig:
        raise ConfigError("a shared pod needs its KUBECONFIG", pod=config.pod_name)
    api = await async_api_client(Path(kubeconfig), environ=env)
    try:
        await SidecarAgent(config, api, registry, NoopEngine(config.root)).run()
    finally:
        await api.close()
