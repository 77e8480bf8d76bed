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

from hotload.api.pod import (
    ENV_DEPLOYMENT,
    ENV_NODE_NAME,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_ROOT,
)
from hotload.errors import ConfigError
from hotload.mounts import root_from
from hotload.sidecar import AgentConfig
from hotload.storage import StorageCredentials


def agent_config(env: Mapping[str, str]) -> AgentConfig:
    """The agent's frozen config from a shared pod's sidecar environment."""
    missing = [
        name for name in (ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_DEPLOYMENT) if not env.get(name)
    ]
    if missing:
        raise ConfigError(
            "a shared pod's sidecar lacks the pod contract's environment", missing=missing
        )
    key_id = env.get("AWS_ACCESS_KEY_ID")
    secret = env.get("AWS_SECRET_ACCESS_KEY")
    credentials = (
        StorageCredentials(
            access_key_id=key_id,
            secret_access_key=secret,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )
        if key_id and secret
        else None
    )
    return AgentConfig(
        pod_name=env[ENV_POD_NAME],
        namespace=env[ENV_POD_NAMESPACE],
        deployment=env[ENV_DEPLOYMENT],
        pod_ip=env.get(ENV_POD_IP) or None,
        node_name=env.get(ENV_NODE_NAME) or None,
        credentials=credentials,
        root=root_from(env.get(ENV_ROOT)),
        serve_http=False,
    )


async def run_sidecar_agent(env: Mapping[str, str], registry: CollectorRegistry) -> None:
    """Run one pod's agent until cancelled."""
    from hotload.engines import NoopEngine
    from hotload.kube import async_api_client
    from hotload.sidecar import SidecarAgent

    config = agent_config(env)
    kubeconfig = env.get("KUBECONFIG")
    if not kubeconfig:
        raise ConfigError("a shared pod needs its KUBECONFIG", pod=config.pod_name)
    api = await async_api_client(Path(kubeconfig))
    try:
        await SidecarAgent(config, api, registry, NoopEngine()).run()
    finally:
        await api.close()
