"""The one console script, ``hotload``, with a subcommand per job (CONTRACTS.md, "Commands").

Each subcommand lives in its own module with its own ``typer.Typer`` and is imported only
when it runs (:mod:`hotload.cli.lazy_group`): ``hotload --help`` imports none of them.
Keep each module's top-level imports light (typer, the standard library); heavy imports
(torch, kopf, the engines, the snapshot codec) go inside the command functions. Exit
codes: 0 ok, 1 failed, 2 usage.

**Adding a subcommand** is one line in :data:`SUBCOMMANDS` below::

    LazyCommand("status", "hotload.cli.status:app", "<first line of its help>"),

where ``hotload/cli/status.py`` defines ``app = typer.Typer()`` (one ``@app.command()``,
or a group of them with ``typer.Typer(name=..., help=..., no_args_is_help=True)``). The
help string is what ``hotload --help`` lists; ``tests/unit/cli`` fails until it equals
the first paragraph of the command's own help. Subcommands of ``hotload local`` are
listed the same way in :data:`hotload.cli.local.LOCAL_SUBCOMMANDS`.
"""

from __future__ import annotations

import sys
from typing import Final

import typer

from hotload.cli.lazy_group import LazyCommand, lazy_group
from hotload.errors import HotloadError

#: Every subcommand of ``hotload``, in the order ``hotload --help`` lists them.
SUBCOMMANDS: Final = (
    LazyCommand(
        "crds",
        "hotload.cli.crds:app",
        "Print (or write) the CustomResourceDefinitions of RolloutDeployment and PolicySnapshot.",
    ),
    LazyCommand(
        "sidecar",
        "hotload.cli.sidecar:app",
        "Run the weight-swap agent of this pod (env from the downward API).",
    ),
    LazyCommand(
        "operator",
        "hotload.cli.operator:app",
        "Run the operator: rollouts, the per-replica ledger, chain validation, fallback to full.",
    ),
    LazyCommand(
        "status",
        "hotload.cli.status:app",
        "Per region: each deployment's target, current snapshot, counts and conditions.",
    ),
    LazyCommand(
        "ledger",
        "hotload.cli.ledger:app",
        "Per replica: what it serves, its state, since when, how, and why it failed.",
    ),
    LazyCommand(
        "local",
        "hotload.cli.local:local_app",
        "Local regions: etcd, kube-apiserver, controller-manager, scheduler and kwok per "
        "region on loopback, with fake GPU nodes.",
    ),
    LazyCommand(
        "engine",
        "hotload.cli.engine:engine_app",
        "Run an inference engine (the engine container's command).",
    ),
    LazyCommand(
        "snapshot",
        "hotload.cli.snapshot:snapshot_app",
        "Encode, decode, verify and inspect hotload-delta/v2 snapshots.",
    ),
    LazyCommand(
        "publish",
        "hotload.cli.publish:app",
        "Publish a model directory as the next snapshot, to every region.",
    ),
    LazyCommand(
        "gc",
        "hotload.cli.gc:app",
        "Remove bucket prefixes that no retained PolicySnapshot in any region needs.",
    ),
)

app = typer.Typer(
    name="hotload",
    help="Keep RL rollout fleets in every region on the freshest policy snapshot.",
    cls=lazy_group(SUBCOMMANDS),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


@app.callback()
def root(
    log_level: str = typer.Option(
        "INFO", "--log-level", envvar="HOTLOAD_LOG_LEVEL", help="debug, info, warning or error."
    ),
) -> None:
    """Keep RL rollout fleets in every region on the freshest policy snapshot."""
    from hotload import logs

    logs.configure(log_level)


def main() -> None:
    """Entry point: typed errors become one clear line on stderr and exit code 1."""
    try:
        app()
    except HotloadError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(1)
