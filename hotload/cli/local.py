"""``hotload local up|down|status``: the local regions (real control planes on loopback).

``local_app`` is the ``local`` group. Its other subcommands live in their own modules and
load only when they run (:mod:`hotload.cli.lazy_group`): adding one is one line in
:data:`LOCAL_SUBCOMMANDS` (see :mod:`hotload.cli`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer

from hotload.cli.lazy_group import LazyCommand, lazy_group
from hotload.cli.output import OutputFormat, emit, print_table

if TYPE_CHECKING:
    from hotload.local.lifecycle import RegionStatus

STATE_HELP = "State directory (default: $HOTLOAD_STATE or ~/.local/state/hotload)."

#: Subcommands of ``hotload local`` in their own modules, listed after up, down, status.
LOCAL_SUBCOMMANDS: Final = (
    LazyCommand(
        "runtime",
        "hotload.cli.local_runtime:runtime_app",
        "Run the pods of one local region (started by `hotload local up`).",
    ),
    LazyCommand(
        "runtime-host",
        "hotload.cli.local_runtime:runtime_host_app",
        "Host shared-mode agents as tasks (started by the runtime; commands on stdin).",
        hidden=True,
    ),
    LazyCommand(
        "echo-server",
        "hotload.cli.local_runtime:echo_server_app",
        "Answer with this pod's identity (a container for checking a local region).",
    ),
    LazyCommand(
        "demo",
        "hotload.cli.local_demo:app",
        "Train and publish to three regions, break one delta, watch every replica follow.",
    ),
)

local_app = typer.Typer(
    name="local",
    help="Local regions: etcd, kube-apiserver, controller-manager, scheduler and kwok per "
    "region on loopback, with fake GPU nodes.",
    cls=lazy_group(LOCAL_SUBCOMMANDS),
    no_args_is_help=True,
)


def _names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


@local_app.command("up")
def up_command(
    regions: int | None = typer.Option(
        None, "--regions", "-n", min=1, help="How many regions (named region-1 … region-N)."
    ),
    names: str | None = typer.Option(
        None, "--names", help="Comma-separated region names instead of a count."
    ),
    nodes: int = typer.Option(2, "--nodes", min=1, help="Fake GPU nodes per region."),
    gpus_per_node: int = typer.Option(
        8, "--gpus-per-node", min=0, help="nvidia.com/gpu per fake node."
    ),
    index_base: int = typer.Option(
        1, "--index-base", min=1, max=255, help="Region i owns 127.<base+i-1>.0.0/16."
    ),
    state: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP),
    build: bool = typer.Option(
        False, "--build", help="Run hack/build-tools first when binaries are missing."
    ),
    object_storage: bool = typer.Option(
        False,
        "--object-storage",
        help="A bucket per region (MinIO) behind an emulated WAN link (toxiproxy), "
        "replicated between the regions.",
    ),
    wan_rate: int = typer.Option(
        0, "--wan-rate", min=0, help="WAN link bandwidth in KB/s each way (0: unlimited)."
    ),
    wan_latency: int = typer.Option(
        0, "--wan-latency", min=0, help="WAN link one-way latency in ms."
    ),
    replication: bool = typer.Option(
        True, "--replication/--no-replication", help="MinIO bucket replication between regions."
    ),
    prometheus: bool = typer.Option(
        False, "--prometheus", help="A Prometheus per region scraping operators and sidecars."
    ),
) -> None:
    """Start the local regions (or report that they are already up) and print how to reach them."""
    from hotload.errors import ConfigError
    from hotload.local import lifecycle as local_regions
    from hotload.local.region import RegionAddons, WanLink

    chosen = _names(names)
    if chosen is not None and regions is not None:
        raise ConfigError("give --regions or --names, not both")
    result = local_regions.up(
        chosen,
        regions=regions if chosen is None else None,
        state_dir=state,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        index_base=index_base,
        build=build,
        addons=RegionAddons(
            object_storage=object_storage,
            wan=WanLink(rate_kb_s=wan_rate, latency_ms=wan_latency),
            replication=replication,
            prometheus=prometheus,
        ),
    )
    from hotload.local import object_storage as buckets
    from hotload.local import prometheus as local_prometheus
    from hotload.local import wan

    for region in result.regions:
        typer.echo(
            f"{region.name}: {region.apiserver_url}  pods 127.{region.index}.0.0/16  "
            f"{region.nodes} nodes x {region.gpus_per_node} GPUs"
        )
        if buckets.enabled(region):
            typer.echo(
                f"  bucket {buckets.bucket_url(region)}: in-region {buckets.endpoint(region)}, "
                f"over the WAN {wan.endpoint(region)}"
            )
        if local_prometheus.enabled(region):
            typer.echo(f"  prometheus {local_prometheus.url(region)}")
    typer.echo(f"export KUBECONFIG={result.kubeconfig}")
    if any(buckets.enabled(region) for region in result.regions):
        typer.echo(f"export AWS_SHARED_CREDENTIALS_FILE={result.aws_credentials_file}")
        typer.echo(f"export AWS_CONFIG_FILE={result.aws_config_file}")


@local_app.command("down")
def down_command(
    state: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP),
) -> None:
    """Stop every process of the local regions and remove their state (logs stay)."""
    from hotload.local import lifecycle as local_regions

    local_regions.down(state)
    typer.echo("local regions are down")


@local_app.command("status")
def status_command(
    state: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Each region: apiserver URL, processes alive, nodes Ready, Service ports.

    Exits 1 when no region is up or any region is unhealthy.
    """
    from hotload.local import lifecycle as local_regions

    statuses = local_regions.status(state)
    data = [s.model_dump(mode="json", by_alias=True) for s in statuses]
    if not emit(data, output):
        if statuses:
            _print_table(statuses)
        else:
            typer.echo("no local regions are up")
    if not statuses or not all(s.healthy for s in statuses):
        raise typer.Exit(1)


def _print_table(statuses: list[RegionStatus]) -> None:
    rows: list[tuple[str, ...]] = []
    for status in statuses:
        alive = sum(status.processes.values())
        down = [name for name, up in status.processes.items() if not up]
        processes = f"{alive}/{len(status.processes)}" + (
            f" (down: {', '.join(down)})" if down else ""
        )
        nodes = (
            "?"
            if status.nodes_total is None
            else f"{status.nodes_ready}/{status.nodes_total} Ready"
        )
        services = ", ".join(f"{name}={port}" for name, port in status.services.items()) or "-"
        rows.append(
            (status.name, str(status.index), status.apiserver_url, processes, nodes, services)
        )
    columns = ("REGION", "INDEX", "APISERVER", "PROCESSES", "NODES", "SERVICES")
    print_table(columns, rows, width=200)
