"""``hotload status`` and ``hotload ledger``: the fleet at a glance, per region and replica.

``hotload status``: per region, each RolloutDeployment with its target, current snapshot,
replica counts and conditions; degraded and lagging deployments first.
``hotload ledger``: per replica, what it serves, its state against the target, since
when, how it got there (delta, full, replay, reload) and why it failed; failed and
lagging replicas first. ``--snapshot ID`` prints that PolicySnapshot's recorded ledger.

Both read the kube contexts given with ``--context`` (repeatable; default: the current
one), print ``-o table|json|yaml``, and exit 1 when a region could not be read (the
others are still printed).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hotload.cli import app

if TYPE_CHECKING:
    from hotload.cli.fleet_view import DeploymentRow, RegionObjects, ReplicaRow
    from hotload.errors import KubeError


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


CONTEXT_HELP = "Kube context (one region); repeatable. Default: the current context."
NAMESPACE_HELP = "Only this namespace (default: all namespaces)."


def _kubeconfig(path: Path | None) -> Path | None:
    import os

    from hotload.kube import kubeconfig_from

    return path or kubeconfig_from(os.environ) or _default_kubeconfig()


def _default_kubeconfig() -> Path | None:
    default = Path.home() / ".kube" / "config"
    return default if default.exists() else None


def _read(
    kubeconfig: Path | None, contexts: list[str], namespace: str | None
) -> tuple[list[RegionObjects], dict[str, KubeError]]:
    from hotload.cli.fleet_view import read_regions

    return read_regions(_kubeconfig(kubeconfig), contexts, namespace)


def _emit(data: list[dict[str, Any]], output: Output) -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(data, indent=2))
    else:
        import yaml

        typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


def _table(columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=220).print(table)


def _report_errors(errors: dict[str, KubeError]) -> None:
    for region, error in errors.items():
        typer.echo(f"error [{error.reason}]: region {region}: {error}", err=True)
    if errors:
        raise typer.Exit(1)


def _dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _deployment_table(rows: list[DeploymentRow]) -> None:
    def states(row: DeploymentRow) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(row.states.items())) or "-"

    _table(
        ["REGION", "NAMESPACE", "DEPLOYMENT", "READY", "UPDATED", "TARGET", "CURRENT",
         "STATES", "AVAILABLE", "DEGRADED", "MESSAGE"],
        [
            [row.region, row.namespace, row.deployment, f"{row.ready}/{row.desired}",
             f"{row.updated}/{row.desired}", _dash(row.target), _dash(row.current), states(row),
             row.available, row.degraded_reason if row.degraded == "True" else row.degraded,
             _dash(row.message)]
            for row in rows
        ],
    )  # fmt: skip


def _replica_table(rows: list[ReplicaRow]) -> None:
    _table(
        ["REGION", "NAMESPACE", "DEPLOYMENT", "POD", "SNAPSHOT", "TARGET", "STATE", "BEHIND",
         "SINCE", "VIA", "REASON", "MESSAGE"],
        [
            [row.region, row.namespace, row.deployment, row.pod, _dash(row.snapshot),
             _dash(row.target), row.state, _dash(row.behind), _dash(row.since), _dash(row.via),
             _dash(row.reason), _dash(row.message)]
            for row in rows
        ],
    )  # fmt: skip


@app.command("status")
def status(
    context: list[str] = typer.Option([], "--context", help=CONTEXT_HELP),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Default: $KUBECONFIG."),
    output: Output = typer.Option(Output.TABLE, "--output", "-o"),
) -> None:
    """Per region: each deployment's target, current snapshot, counts and conditions."""
    from hotload.cli.fleet_view import as_data, deployment_rows, sort_deployments

    regions, errors = _read(kubeconfig, context, namespace)
    rows = sort_deployments(row for region in regions for row in deployment_rows(region))
    if output is Output.TABLE:
        if rows:
            _deployment_table(rows)
        else:
            typer.echo("no RolloutDeployments")
    else:
        _emit(as_data(rows), output)
    _report_errors(errors)


@app.command("ledger")
def ledger(
    deployment: str | None = typer.Argument(None, help="Only this RolloutDeployment."),
    snapshot: str | None = typer.Option(
        None, "--snapshot", help="Print this PolicySnapshot's recorded ledger instead."
    ),
    context: list[str] = typer.Option([], "--context", help=CONTEXT_HELP),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Default: $KUBECONFIG."),
    output: Output = typer.Option(Output.TABLE, "--output", "-o"),
) -> None:
    """Per replica: what it serves, its state, since when, how, and why it failed."""
    from hotload.cli.fleet_view import as_data, replica_rows, snapshot_ledger_rows, sort_replicas

    regions, errors = _read(kubeconfig, context, namespace)
    if snapshot is not None:
        rows = [row for region in regions for row in snapshot_ledger_rows(region, snapshot)]
    else:
        rows = [row for region in regions for row in replica_rows(region, deployment)]
    rows = sort_replicas(rows)
    if output is Output.TABLE:
        if rows:
            _replica_table(rows)
        else:
            typer.echo("no replicas")
    else:
        _emit(as_data(rows), output)
    _report_errors(errors)
