"""``hotload publish DIR`` and ``hotload gc``: the trainer's side from a shell.

``publish`` sends one model directory (Hugging Face layout) as the next snapshot of a
deployment to every region given (``--context``, repeatable): a Full or a delta against
the previous publish (kept in the work directory, so successive calls chain), uploaded
to each region's bucket (or only the ``--home`` bucket when buckets replicate), applied as
a PolicySnapshot in each region, and with ``--wait`` watched until Ready everywhere. Exit
codes: 0 when every region ended Ready, Superseded or Applied; 1 otherwise (``-o json``
says which region did what); 2 for usage errors.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from hotload.cli import app


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def _emit(data: Any, output: OutputFormat) -> bool:
    """Print ``data`` as JSON or YAML; False when the caller prints a table."""
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(data, indent=2))
        return True
    if output is OutputFormat.YAML:
        import yaml

        typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
        return True
    return False


def _kubeconfig(option: Path | None) -> Path | None:
    """--kubeconfig, else $KUBECONFIG, else ~/.kube/config, else in-cluster (None)."""
    from hotload.kube import kubeconfig_from

    if option is not None:
        return option
    from_env = kubeconfig_from(os.environ)
    if from_env is not None:
        return from_env
    default = Path.home() / ".kube" / "config"
    return default if default.is_file() else None


def _contexts(given: list[str] | None, kubeconfig: Path | None) -> list[str]:
    """The contexts given, else the kubeconfig's current one."""
    from hotload.errors import ConfigError

    if given:
        return given
    if kubeconfig is None:
        raise ConfigError("give --context (one per region), or a kubeconfig with a current one")
    import yaml

    current = (yaml.safe_load(kubeconfig.read_text()) or {}).get("current-context")
    if not current:
        raise ConfigError("give --context: the kubeconfig has no current context")
    return [str(current)]


def _endpoints(values: list[str] | None) -> dict[str, str]:
    from hotload.errors import ConfigError

    endpoints = {}
    for value in values or []:
        context, sep, url = value.partition("=")
        if not sep or not context or not url:
            raise ConfigError("--endpoint takes CONTEXT=URL", value=value)
        endpoints[context] = url
    return endpoints


def default_workdir(namespace: str, deployment: str) -> Path:
    """``$HOTLOAD_STATE/publish/<namespace>/<deployment>`` (outside any clone)."""
    from hotload.local.locations import state_dir

    return state_dir() / "publish" / namespace / deployment


CONTEXT_HELP = "Kube context of a region (repeatable); default: the current context."
NAMESPACE_HELP = "Namespace of the RolloutDeployment in every region."


@app.command("publish")
def publish_command(
    directory: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="The model directory (safetensors, config)."
    ),
    deployment: str = typer.Option(..., "--deployment", "-d", help="The RolloutDeployment."),
    step: int = typer.Option(..., "--step", min=0, help="The trainer's step of these weights."),
    context: list[str] | None = typer.Option(None, "--context", "-c", help=CONTEXT_HELP),
    namespace: str = typer.Option("default", "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Default: $KUBECONFIG."),
    workdir: Path | None = typer.Option(
        None,
        "--workdir",
        help="The publisher's state (previous weights, queue of regions that did not answer); "
        "default $HOTLOAD_STATE/publish/<namespace>/<deployment>.",
    ),
    prefix: str | None = typer.Option(
        None, "--prefix", help="Identities are <prefix>-step-<n>[-full]; default: deployment."
    ),
    full: bool = typer.Option(False, "--full", help="Publish a Full whatever the cadence."),
    full_every: int = typer.Option(25, "--full-every", min=1, help="A Full every N steps."),
    home: str | None = typer.Option(
        None, "--home", help="With bucket replication: write only this context's bucket."
    ),
    endpoint: list[str] | None = typer.Option(
        None,
        "--endpoint",
        help="CONTEXT=URL: where to write that region's bucket (default: its "
        "RolloutDeployment's publish-endpoint annotation, else spec.hotLoad.endpoint).",
    ),
    wait: bool = typer.Option(False, "--wait", help="Wait until Ready in every region."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds --wait waits per region."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Publish a model directory as the next snapshot, to every region."""
    from hotload.publish import Publisher, PublisherSettings

    config = _kubeconfig(kubeconfig)
    contexts = _contexts(context, config)
    settings = PublisherSettings(
        deployment=deployment,
        contexts=tuple(contexts),
        workdir=workdir or default_workdir(namespace, deployment),
        namespace=namespace,
        kubeconfig=config,
        identity_prefix=prefix,
        full_every=full_every,
        home=home,
        wait=wait,
        wait_timeout_s=timeout,
        endpoints=_endpoints(endpoint),
    )
    live = output is OutputFormat.TABLE and sys.stderr.isatty()
    from hotload.cli.publish_progress import LinesProgress, LiveProgress

    observer: LinesProgress | LiveProgress = LiveProgress(contexts) if live else LinesProgress()
    with Publisher(settings, observer=observer) as publisher:
        if isinstance(observer, LiveProgress):
            with observer:
                result = publisher.publish(directory, step, full=full).result()
        else:
            result = publisher.publish(directory, step, full=full).result()
    if not _emit(result.model_dump(mode="json", by_alias=True), output):
        _print_result(result)
    if not result.ok:
        raise typer.Exit(1)


def _print_result(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    shown = result.fallback or result
    console = Console(width=200)
    if result.fallback is not None:
        console.print(
            f"{result.identity} broke the chain in a region; published the Full "
            f"{shown.identity} instead"
        )
    console.print(
        f"{shown.identity}: {shown.kind.value} of step {shown.step} ({shown.why}), "
        f"{shown.stored_bytes:,} bytes, {shown.ratio:.0f}x smaller than the full weights; "
        f"encoded in {shown.encode_seconds:.2f} s"
    )
    table = Table(box=None, pad_edge=False)
    for column in ("REGION", "OUTCOME", "UPLOADED", "READY", "SECONDS", "PENDING", "ERROR"):
        table.add_column(column)
    for context, region in shown.regions.items():
        replicas = (
            f"{region.ready_replicas}/{region.desired_replicas}"
            if region.desired_replicas is not None
            else "-"
        )
        seconds = (
            region.ready_seconds if region.ready_seconds is not None else region.applied_seconds
        )
        table.add_row(
            context,
            region.outcome.value,
            f"{region.uploaded_bytes:,}",
            replicas,
            "-" if seconds is None else f"{seconds:.1f}",
            ", ".join(region.pending) or "-",
            region.error or "",
        )
    console.print(table)


@app.command("gc")
def gc_command(
    deployment: str = typer.Option(..., "--deployment", "-d", help="The RolloutDeployment."),
    context: list[str] | None = typer.Option(None, "--context", "-c", help=CONTEXT_HELP),
    namespace: str = typer.Option("default", "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Default: $KUBECONFIG."),
    prefix: str | None = typer.Option(
        None, "--prefix", help="Only prefixes <prefix>-step-… are touched; default: deployment."
    ),
    min_age: float = typer.Option(
        3600.0, "--min-age", min=0, help="Seconds an unneeded prefix must be old to go."
    ),
    endpoint: list[str] | None = typer.Option(None, "--endpoint", help="CONTEXT=URL."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; delete nothing."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Remove bucket prefixes that no retained PolicySnapshot in any region needs.

    Every region given must answer (else nothing is deleted): a region that does not
    could still need any snapshot.
    """
    import asyncio

    from hotload.publish.cadence import check_prefix
    from hotload.publish.garbage import collect_garbage
    from hotload.publish.region_client import RegionClient

    config = _kubeconfig(kubeconfig)
    contexts = _contexts(context, config)
    clients = {c: RegionClient(c, config, namespace, deployment) for c in contexts}
    try:
        result = asyncio.run(
            collect_garbage(
                clients,
                prefix=check_prefix(prefix or deployment),
                min_age=timedelta(seconds=min_age),
                dry_run=dry_run,
                endpoints=_endpoints(endpoint),
            )
        )
    finally:
        for client in clients.values():
            client.close()
    if _emit(result.model_dump(mode="json", by_alias=True), output):
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{len(result.needed)} snapshots still needed by some region")
    for bucket in result.buckets:
        typer.echo(
            f"{bucket.bucket_url} ({', '.join(bucket.contexts)}): {verb} "
            f"{len(bucket.deleted)} snapshots, {bucket.deleted_bytes:,} bytes"
            + (f"; {len(bucket.kept_young)} too young to go" if bucket.kept_young else "")
        )
