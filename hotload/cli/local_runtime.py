"""``hotload local runtime|runtime-host|echo-server``: the pod runtime's processes.

``runtime`` is started per region by ``hotload local up`` (and stopped by ``down``);
``runtime-host`` by the runtime for its shared mode; ``echo-server`` is a small
container command for checking a region (see ``docs/pod-runtime.md``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer

from hotload.cli.local import STATE_HELP

runtime_app = typer.Typer()
runtime_host_app = typer.Typer()
echo_server_app = typer.Typer()


@runtime_app.command("runtime")
def runtime_command(
    region: str = typer.Option(..., "--region", help="The region whose pods to run."),
    state: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP),
    backoff_initial: float = typer.Option(
        10.0,
        "--backoff-initial",
        envvar="HOTLOAD_RUNTIME_BACKOFF_INITIAL",
        min=0.0,
        help="Crash-loop backoff before the second restart (doubles each time; kubelet: 10).",
    ),
    backoff_max: float = typer.Option(
        300.0,
        "--backoff-max",
        envvar="HOTLOAD_RUNTIME_BACKOFF_MAX",
        min=0.0,
        help="Crash-loop backoff cap in seconds (kubelet: 300).",
    ),
    stop_grace: float = typer.Option(
        10.0,
        "--stop-grace",
        envvar="HOTLOAD_RUNTIME_STOP_GRACE",
        min=0.0,
        help="Cap on each container's grace period when the runtime itself stops.",
    ),
    agent_factory: str | None = typer.Option(
        None,
        "--agent-factory",
        envvar="HOTLOAD_RUNTIME_AGENT_FACTORY",
        help="module:function the shared-mode hosts run per pod (default: the sidecar agent).",
    ),
) -> None:
    """Run the pods of one local region (started by `hotload local up`)."""
    from hotload.errors import LocalRegionError
    from hotload.local.lifecycle import load
    from hotload.local.runtime import RestartBackoff, run_runtime, settings_for

    regions = load(state)
    if regions is None:
        raise LocalRegionError("no local regions in this state directory", state_dir=str(state))
    overrides: dict[str, object] = {
        "backoff": RestartBackoff(initial_s=backoff_initial, maximum_s=backoff_max),
        "stop_grace_s": stop_grace,
        "base_env": dict(os.environ),
    }
    if agent_factory:
        overrides["agent_factory"] = agent_factory
    settings = settings_for(regions.region(region), **overrides)
    asyncio.run(run_runtime(settings))


@runtime_host_app.command("runtime-host", hidden=True)
def runtime_host_command(
    name: str = typer.Option(..., "--name", help="The deployment this host serves (for logs)."),
    agent_factory: str = typer.Option(..., "--agent-factory", help="module:function per pod."),
    schedule: str = typer.Option(
        "ranked",
        "--schedule",
        envvar="HOTLOAD_SHARED_HOST_SCHEDULE",
        help="ranked: the agent started first gets the threads first (replicas finish one "
        "after another, as on separate machines); fifo: every agent's calls in turn.",
    ),
) -> None:
    """Host shared-mode agents as tasks (started by the runtime; commands on stdin)."""
    import logging

    from hotload.local.runtime.shared_host_main import load_factory, run_host

    logging.getLogger(__name__).info("shared host starting", extra={"host": name})
    run_host(load_factory(agent_factory), schedule)


@echo_server_app.command("echo-server")
def echo_server_command(
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="Port to bind on $POD_IP."),
    ignore_sigterm: bool = typer.Option(
        False, "--ignore-sigterm", help="Ignore SIGTERM (to check the SIGKILL after the grace)."
    ),
) -> None:
    """Answer with this pod's identity (a container for checking a local region)."""
    import signal

    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from hotload.local.runtime.echo_server import serve

    asyncio.run(serve(dict(os.environ), port, ignore_sigterm=ignore_sigterm))
