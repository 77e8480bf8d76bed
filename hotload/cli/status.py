"""``hotload status``: per region, each RolloutDeployment at a glance.

Target, current snapshot, replica counts and conditions; degraded and lagging
deployments first. ``--context`` is repeatable (one region each).
"""

from __future__ import annotations

from pathlib import Path

import typer

from hotload.cli.fleet_output import (
    CONTEXT_HELP,
    KUBECONFIG_HELP,
    NAMESPACE_HELP,
    TABLE_WIDTH,
    dash,
    read,
    report_errors,
)
from hotload.cli.output import OutputFormat, emit, print_table

app = typer.Typer()

COLUMNS = ["REGION", "NAMESPACE", "DEPLOYMENT", "READY", "UPDATED", "TARGET", "CURRENT",
           "LAG", "STATES", "WAITING", "AVAILABLE", "DEGRADED", "MESSAGE"]  # fmt: skip


@app.command("status")
def status(
    context: list[str] = typer.Option([], "--context", help=CONTEXT_HELP),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help=KUBECONFIG_HELP),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Per region: each deployment's target, current snapshot, counts and conditions.

    LAG is the freshness lag in steps: the newest snapshot on the deployment's chain in any
    region given, minus the oldest one a replica of this region serves. WAITING counts the
    reasons replicas give for not being at the target (StorageUnavailable, a failure, ...).
    Degraded and lagging deployments come first. Exits 1 when a region cannot be read.
    """
    from hotload.cli.fleet_view import as_data, deployment_rows, newest_steps, sort_deployments

    regions, errors = read(kubeconfig, context, namespace)
    newest = newest_steps(regions)
    rows = sort_deployments(row for region in regions for row in deployment_rows(region, newest))
    if not emit(as_data(rows), output):
        if not rows:
            typer.echo("no RolloutDeployments")
        else:
            print_table(
                COLUMNS,
                [
                    [row.region, row.namespace, row.deployment, f"{row.ready}/{row.desired}",
                     f"{row.updated}/{row.desired}", dash(row.target), dash(row.current),
                     dash(row.lag),
                     " ".join(f"{k}={v}" for k, v in sorted(row.states.items())) or "-",
                     " ".join(f"{k}={v}" for k, v in sorted((row.waiting or {}).items())) or "-",
                     row.available,
                     row.degraded_reason if row.degraded == "True" else row.degraded,
                     dash(row.message)]
                    for row in rows
                ],
                width=TABLE_WIDTH,
            )  # fmt: skip
    report_errors(errors)
