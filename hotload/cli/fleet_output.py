"""Options and printing shared by ``hotload status`` and ``hotload ledger`` (light imports).

Both read the kube contexts given with ``--context`` (repeatable; default: the current
one), print ``-o table|json|yaml``, and exit 1 when a region could not be read (the
others are still printed, its error on stderr).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer

if TYPE_CHECKING:
    from hotload.cli.fleet_view import RegionObjects
    from hotload.errors import KubeError

CONTEXT_HELP: Final = "Kube context (one region); repeatable. Default: the current context."
NAMESPACE_HELP: Final = "Only this namespace (default: all namespaces)."
KUBECONFIG_HELP: Final = "Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."
TABLE_WIDTH: Final = 220


def kubeconfig_path(path: Path | None) -> Path | None:
    """``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config`` when it exists."""
    from hotload.kube import kubeconfig_from

    if path is not None:
        return path
    from_env = kubeconfig_from(os.environ)
    if from_env is not None:
        return from_env
    default = Path.home() / ".kube" / "config"
    return default if default.exists() else None


def read(
    kubeconfig: Path | None, contexts: list[str], namespace: str | None
) -> tuple[list[RegionObjects], dict[str, KubeError]]:
    from hotload.cli.fleet_view import read_regions

    return read_regions(kubeconfig_path(kubeconfig), contexts, namespace)


def dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def report_errors(errors: dict[str, KubeError]) -> None:
    """One line per region that could not be read; exit 1 if there was any."""
    for region, error in errors.items():
        typer.echo(f"error [{error.reason}]: region {region}: {error}", err=True)
    if errors:
        raise typer.Exit(1)
