"""``hotload ledger``: per replica, what it serves and how it got there.

Each replica's snapshot, its state against the target, since when, how many steps it
is behind, how it got there (delta, full, replay, reload) and why it failed; failed and
lagging replicas first. ``--snapshot ID`` prints that PolicySnapshot's recorded ledger
(how that snapshot rolled out) instead of the pods' live reports.
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

COLUMNS = ["REGION", "NAMESPACE", "DEPLOYMENT", "POD", "SNAPSHOT", "TARGET", "STATE", "BEHIND",
           "LAG", "SINCE", "VIA", "REASON", "MESSAGE"]  # fmt: skip


@app.command("ledger")
def ledger(
    deployment: str | None = typer.Argument(None, help="Only this RolloutDeployment."),
    snapshot: str | None = typer.Option(
        None, "--snapshot", help="Print this PolicySnapshot's recorded ledger instead."
    ),
    context: list[str] = typer.Option([], "--context", help=CONTEXT_HELP),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help=KUBECONFIG_HELP),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Per replica: what it serves, its state, since when, how, and why it is not at the
    target (its pod's reason: a failure, or what a retry waits on).

    BEHIND counts steps to the region's target; LAG to the newest snapshot published for
    the deployment in any region given (the freshness lag). Failed and lagging replicas
    come first. Exits 1 when a region cannot be read.
    """
    from hotload.cli.fleet_view import (
        as_data,
        newest_steps,
        replica_rows,
        snapshot_ledger_rows,
        sort_replicas,
    )

    regions, errors = read(kubeconfig, context, namespace)
    if snapshot is not None:
        rows = [row for region in regions for row in snapshot_ledger_rows(region, snapshot)]
    else:
        newest = newest_steps(regions)
        rows = [row for region in regions for row in replica_rows(region, deployment, newest)]
    rows = sort_replicas(rows)
    if not emit(as_data(rows), output):
        if not rows:
            typer.echo("no replicas")
        else:
            print_table(
                COLUMNS,
                [
                    [row.region, row.namespace, row.deployment, row.pod, dash(row.snapshot),
                     dash(row.target), row.state, dash(row.behind), dash(row.lag),
                     dash(row.since),
                     dash(row.via), dash(row.reason), dash(row.message)]
                    for row in rows
                ],
                width=TABLE_WIDTH,
            )  # fmt: skip
    report_errors(errors)
