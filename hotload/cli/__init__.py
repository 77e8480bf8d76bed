"""The one console script, ``hotload``, with a subcommand per job (CONTRACTS.md, "Commands").

Each subcommand lives in its own module and registers itself on ``app``; heavy imports
(torch, kopf, the engines) happen inside the command functions so ``hotload --help``
stays fast. Exit codes: 0 ok, 1 failed, 2 usage.
"""

from __future__ import annotations

import importlib
import sys
from typing import Final

import typer

from hotload.errors import HotloadError

app = typer.Typer(
    name="hotload",
    help="Keep RL rollout fleets in every region on the freshest policy snapshot.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
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


#: Modules that register subcommands on ``app`` (the place for each subcommand).
#: crds · snapshot · local · sidecar · engine  — later: operator, publish, status, ledger, gc
SUBCOMMAND_MODULES: Final = (
    "hotload.cli.crds",
    "hotload.cli.local",
    "hotload.cli.local_runtime",
    "hotload.cli.local_demo",
    "hotload.cli.engine",
    "hotload.cli.snapshot",
    "hotload.cli.sidecar",
)

for _module in SUBCOMMAND_MODULES:
    importlib.import_module(_module)


def main() -> None:
    """Entry point: typed errors become one clear line on stderr and exit code 1."""
    try:
        app()
    except HotloadError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(1)
