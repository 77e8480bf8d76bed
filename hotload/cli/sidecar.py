"""``hotload sidecar``: the weight-swap agent of one pod, built from the pod contract's env.

The only place that reads the environment for the agent (CONTRACTS.md, pod contract):
``POD_NAME``, ``POD_NAMESPACE``, ``POD_IP``, ``NODE_NAME``, ``HOTLOAD_DEPLOYMENT``,
``HOTLOAD_ROOT``, ``KUBECONFIG`` (else the in-cluster service account) and the bucket
credentials under boto3's names. Everything else comes from the RolloutDeployment.
SIGTERM and SIGINT cancel the agent, which stops serving and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from hotload.sidecar import AgentConfig

app = typer.Typer()


def config_from_env(
    environ: Mapping[str, str],
    *,
    port: int,
    download_concurrency: int,
    download_part_size: int,
    hold_timeout_s: float,
    sync_drain_timeout_s: float = 60.0,
    max_request_bytes: int = 16 * 1024 * 1024,
    max_json_depth: int = 64,
) -> AgentConfig:
    """The agent's config from the pod contract's environment (``ConfigError`` if short)."""
    from hotload.sidecar.config import config_from_pod_env

    return config_from_pod_env(
        environ,
        serve_http=True,
        http_port=port,
        download_concurrency=download_concurrency,
        download_part_size=download_part_size,
        hold_timeout_s=hold_timeout_s,
        sync_drain_timeout_s=sync_drain_timeout_s,
        max_request_bytes=max_request_bytes,
        max_json_depth=max_json_depth,
    )


async def _run(environ: Mapping[str, str], config: AgentConfig) -> None:
    import httpx
    from prometheus_client import CollectorRegistry

    from hotload.api import EngineSpec
    from hotload.api.rollout_deployment import ENV_ENGINE_ADMIN_API_KEY, ENV_ENGINE_API_KEY
    from hotload.engines import Engine, engine_url, make_engine
    from hotload.kube import async_api_client, kubeconfig_from
    from hotload.sidecar import SidecarAgent

    api = await async_api_client(kubeconfig_from(environ), environ=environ)
    engine_client = httpx.AsyncClient(timeout=30.0)

    def engine_for(spec: EngineSpec) -> Engine:
        # The engine's keys come from spec.engine.keysSecretRef, as env (never logged).
        return make_engine(
            spec.kind,
            engine_url(config.engine_host, spec.port),
            engine_client,
            api_key=environ.get(ENV_ENGINE_API_KEY) or None,
            admin_api_key=environ.get(ENV_ENGINE_ADMIN_API_KEY) or None,
            verify_digest=spec.verify_digest,
            launch_version=spec.launch_version,
            root=config.root,
        )

    agent = SidecarAgent(config, api, CollectorRegistry(), engine_for)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        if task is not None:
            loop.add_signal_handler(signum, task.cancel)
    try:
        await agent.run()
    except asyncio.CancelledError:
        pass
    finally:
        await engine_client.aclose()
        await api.close()


@app.command("sidecar")
def sidecar(
    port: int = typer.Option(8480, "--port", help="HTTP port of the front and probes."),
    download_concurrency: int = typer.Option(
        8, "--download-concurrency", min=1, help="Parallel ranged reads per file."
    ),
    download_part_size: int = typer.Option(
        8 * 1024 * 1024,
        "--download-part-size",
        min=4096,
        help="Bytes per ranged read (a killed download resumes by parts).",
    ),
    hold_timeout: float = typer.Option(
        120.0, "--hold-timeout", min=0.1, help="ASYNC: seconds a new request may wait for a swap."
    ),
    sync_drain_timeout: float = typer.Option(
        60.0,
        "--sync-drain-timeout",
        min=0.0,
        help="SYNC: the longest a swap waits for in-flight requests before swapping anyway.",
    ),
    max_request_bytes: int = typer.Option(
        16 * 1024 * 1024, "--max-request-bytes", min=1024, help="Refuse (413) a larger body."
    ),
    max_json_depth: int = typer.Option(
        64, "--max-json-depth", min=2, help="The front refuses (400) JSON nesting deeper."
    ),
) -> None:
    """Run the weight-swap agent of this pod (env from the downward API)."""
    environ = dict(os.environ)
    config = config_from_env(
        environ,
        port=port,
        download_concurrency=download_concurrency,
        download_part_size=download_part_size,
        hold_timeout_s=hold_timeout,
        sync_drain_timeout_s=sync_drain_timeout,
        max_request_bytes=max_request_bytes,
        max_json_depth=max_json_depth,
    )
    asyncio.run(_run(environ, config))
