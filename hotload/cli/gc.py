"""``hotload gc``: remove the bucket prefixes no retained PolicySnapshot in any region needs
(see :mod:`hotload.publish.garbage`)."""

from __future__ import annotations

from pathlib import Path

import typer

from hotload.cli.fleet_output import CONTEXT_HELP, KUBECONFIG_HELP, kubeconfig_path
from hotload.cli.kube_contexts import (
    ENDPOINT_HELP,
    NAMESPACE_HELP,
    parse_endpoints,
    resolve_contexts,
)
from hotload.cli.output import OutputFormat, emit

app = typer.Typer()


@app.command("gc")
def gc_command(
    deployment: str = typer.Option(..., "--deployment", "-d", help="The RolloutDeployment."),
    context: list[str] | None = typer.Option(None, "--context", "-c", help=CONTEXT_HELP),
    namespace: str = typer.Option("default", "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help=KUBECONFIG_HELP),
    prefix: str | None = typer.Option(
        None, "--prefix", help="Only prefixes <prefix>-step-… are touched; default: deployment."
    ),
    min_age: float = typer.Option(
        3600.0, "--min-age", min=0, help="Seconds an unneeded prefix must be old to go."
    ),
    endpoint: list[str] | None = typer.Option(None, "--endpoint", help=ENDPOINT_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; delete nothing."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Remove bucket prefixes that no retained PolicySnapshot in any region needs.

    Every region given must answer (else nothing is deleted): a region that does not
    could still need any snapshot.
    """
    import asyncio
    from datetime import timedelta

    from hotload.publish.cadence import check_prefix
    from hotload.publish.garbage import collect_garbage
    from hotload.publish.region_client import RegionClient

    config = kubeconfig_path(kubeconfig)
    contexts = resolve_contexts(context, config)
    clients = {c: RegionClient(c, config, namespace, deployment) for c in contexts}
    try:
        result = asyncio.run(
            collect_garbage(
                clients,
                prefix=check_prefix(prefix or deployment),
                min_age=timedelta(seconds=min_age),
                dry_run=dry_run,
                endpoints=parse_endpoints(endpoint),
            )
        )
    finally:
        for client in clients.values():
            client.close()
    if emit(result.model_dump(mode="json", by_alias=True), output):
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{len(result.needed)} snapshots still needed by some region")
    for bucket in result.buckets:
        typer.echo(
            f"{bucket.bucket_url} ({', '.join(bucket.contexts)}): {verb} "
            f"{len(bucket.deleted)} snapshots, {bucket.deleted_bytes:,} bytes"
            + (f"; {len(bucket.kept_young)} too young to go" if bucket.kept_young else "")
            + (
                f"; kept {len(bucket.kept_recent_fulls)} recent Fulls (checkpoints perhaps)"
                if bucket.kept_recent_fulls
                else ""
            )
        )
