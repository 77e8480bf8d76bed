"""The one console script, ``hotload``, with a subcommand per job (CONTRACTS.md, "Commands").

Each subcommand lives in its own module with its own ``typer.Typer`` and is imported only
when it runs (:mod:`hotload.cli.lazy_group`): ``hotload --help`` imports none of them.
Keep each module's top-level imports light (typer, the standard library); heavy imports
(torch, kopf, the engines, the snapshot codec) go inside the command functions.

Errors (:func:`main`): every one is a single line on stderr naming its reason,
``error [<Reason>]: <what is wrong, and where>`` — the reason of a typed error
(``ChainBroken``, ``ConfigInvalid``, ...), ``Usage`` for invalid arguments (after the
command's usage line), ``NotFound``/``AccessDenied``/``IOError`` for a file the system
refused, ``InternalError`` for a bug (its traceback only with ``--log-level debug``).
Exit codes: 0 ok, 1 failed, 2 usage (invalid arguments, flags, settings), 130 interrupted.

**Adding a subcommand** is one line in :data:`SUBCOMMANDS` below::

    LazyCommand("status", "hotload.cli.status:app", "<first line of its help>"),

where ``hotload/cli/status.py`` defines ``app = typer.Typer()`` (one ``@app.command()``,
or a group of them with ``typer.Typer(name=..., help=..., no_args_is_help=True)``). The
help string is what ``hotload --help`` lists; ``tests/unit/cli`` fails until it equals
the first paragraph of the command's own help. Subcommands of ``hotload local`` are
listed the same way in :data:`hotload.cli.local.LOCAL_SUBCOMMANDS`.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Final, NoReturn

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
        "Encode, decode, verify and inspect hotload-delta/v3 snapshots.",
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


#: The reason word of an invalid command line.
USAGE_REASON: Final = "Usage"
#: Typed errors that mean "the input is wrong" (exit 2), not "the work failed" (exit 1).
_USAGE_ERRORS: Final = ("ConfigInvalid", "Invalid")


def _fail(reason: str, message: str, code: int) -> NoReturn:
    typer.echo(f"error [{reason}]: {message}", err=True)
    sys.exit(code)


def _os_reason(err: OSError) -> str:
    if isinstance(err, FileNotFoundError | NotADirectoryError):
        return "NotFound"
    if isinstance(err, PermissionError):
        return "AccessDenied"
    return "IOError"


def main(argv: list[str] | None = None) -> None:
    """Entry point: errors become one line naming their reason (see the module doc)."""
    # typer carries its own click: its exceptions, not the click package's, reach us.
    from typer._click import exceptions as click

    try:
        code = app(args=argv, prog_name="hotload", standalone_mode=False)
    except click.NoArgsIsHelpError as err:
        typer.echo(err.format_message())
        sys.exit(2)
    except click.UsageError as err:
        if err.ctx is not None:
            typer.echo(err.ctx.get_usage(), err=True)
            typer.echo(f"Try '{err.ctx.command_path} --help' for help.", err=True)
        _fail(USAGE_REASON, err.format_message(), 2)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        _fail(type(err).__name__, err.format_message(), err.exit_code)
    except HotloadError as err:
        _fail(err.reason, str(err), 2 if err.reason in _USAGE_ERRORS else 1)
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        _fail(_os_reason(err), f"{err.strerror or err}{where}", 1)
    except Exception as err:  # a bug: one line, the traceback only when debugging
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        hint = (
            ""
            if logging.getLogger().isEnabledFor(logging.DEBUG)
            else (" (run with --log-level debug for the traceback)")
        )
        _fail("InternalError", f"{type(err).__name__}: {err}{hint}", 1)
    sys.exit(code if isinstance(code, int) else 0)
