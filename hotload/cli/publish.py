"""``hotload publish DIR``: the trainer's publisher from a shell.

Sends one model directory (Hugging Face layout) as the next snapshot of a deployment to
every region given (``--context``, repeatable): a Full or a delta against the previous
publish (kept in the work directory, so successive calls chain), uploaded to each region's
bucket (or only the ``--home`` bucket when buckets replicate), applied as a PolicySnapshot
in each region, and with ``--wait`` watched until Ready everywhere. Exit codes: 0 when
every region ended Ready, Superseded or Applied; 1 otherwise (``-o json`` says which
region did what); 2 for usage errors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hotload.cli.fleet_output import CONTEXT_HELP, KUBECONFIG_HELP, kubeconfig_path
from hotload.cli.kube_contexts import (
    ENDPOINT_HELP,
    NAMESPACE_HELP,
    parse_endpoints,
    resolve_contexts,
)
from hotload.cli.output import OutputFormat, emit, print_table

if TYPE_CHECKING:
    from hotload.publish import PublishResult

app = typer.Typer()


def default_workdir(namespace: str, deployment: str) -> Path:
    """``$HOTLOAD_STATE/publish/<namespace>/<deployment>`` (outside any clone)."""
    from hotload.local.locations import state_dir

    return state_dir() / "publish" / namespace / deployment


@app.command("publish")
def publish_command(
    directory: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="The model directory (safetensors, config)."
    ),
    deployment: str = typer.Option(..., "--deployment", "-d", help="The RolloutDeployment."),
    step: int = typer.Option(..., "--step", min=0, help="The trainer's step of these weights."),
    context: list[str] | None = typer.Option(None, "--context", "-c", help=CONTEXT_HELP),
    namespace: str = typer.Option("default", "--namespace", "-n", help=NAMESPACE_HELP),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help=KUBECONFIG_HELP),
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
    checkpoints: bool = typer.Option(
        True,
        "--checkpoints/--no-checkpoints",
        help="The cadence's Full goes beside the chain (a checkpoint, format v5) instead of "
        "in it; the command then waits until the checkpoint is in every region's bucket.",
    ),
    home: str | None = typer.Option(
        None, "--home", help="With bucket replication: write only this context's bucket."
    ),
    endpoint: list[str] | None = typer.Option(None, "--endpoint", help=ENDPOINT_HELP),
    wait: bool = typer.Option(False, "--wait", help="Wait until Ready in every region."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds --wait waits per region."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Publish a model directory as the next snapshot, to every region."""
    from hotload.publish import Publisher, PublisherSettings

    config = kubeconfig_path(kubeconfig)
    contexts = resolve_contexts(context, config)
    settings = PublisherSettings(
        deployment=deployment,
        contexts=tuple(contexts),
        workdir=workdir or default_workdir(namespace, deployment),
        namespace=namespace,
        kubeconfig=config,
        identity_prefix=prefix,
        full_every=full_every,
        checkpoints=checkpoints,
        home=home,
        wait=wait,
        wait_timeout_s=timeout,
        endpoints=parse_endpoints(endpoint),
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
        # A one-shot command: finish the checkpoint it began (or resumed) before leaving.
        publisher.wait_for_checkpoint(timeout)
    if not emit(result.model_dump(mode="json", by_alias=True), output):
        _print_result(result)
    if not result.ok:
        raise typer.Exit(1)


def _print_result(result: PublishResult) -> None:
    shown = result.fallback or result
    if result.fallback is not None:
        typer.echo(
            f"{result.identity} broke the chain in a region; published the Full "
            f"{shown.identity} at once"
        )
    typer.echo(
        f"{shown.identity}: {shown.kind.value} of step {shown.step} ({shown.why}), "
        f"{shown.stored_bytes:,} bytes, {shown.ratio:.0f}x smaller than the full weights; "
        f"the trainer was blocked {shown.blocked_seconds * 1000:.1f} ms, "
        f"encoding took {shown.encode_seconds:.2f} s"
    )
    if shown.checkpoint:
        typer.echo(f"it names the checkpoint {shown.checkpoint}: new replicas start from there")
    if shown.checkpoint_begun:
        typer.echo(
            f"a checkpoint of its weights went out beside the chain: {shown.checkpoint_begun}"
        )
    for ended in shown.checkpoint_done:
        state = "complete in every region's bucket" if ended.complete else f"failed: {ended.error}"
        typer.echo(f"checkpoint {ended.identity}: {state}")
    rows = []
    for context, region in shown.regions.items():
        replicas = (
            f"{region.ready_replicas}/{region.desired_replicas}"
            if region.desired_replicas is not None
            else "-"
        )
        seconds = (
            region.ready_seconds if region.ready_seconds is not None else region.applied_seconds
        )
        rows.append(
            (
                context,
                region.outcome.value,
                f"{region.uploaded_bytes:,}",
                replicas,
                "-" if seconds is None else f"{seconds:.1f}",
                ", ".join(region.pending) or "-",
                region.error or "",
            )
        )
    print_table(
        ("REGION", "OUTCOME", "UPLOADED", "READY", "SECONDS", "PENDING", "ERROR"), rows, width=200
    )
