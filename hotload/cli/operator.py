"""``hotload operator``: the kopf operator, embedded in our CLI with our logging.

The command line the chart runs (agreed with it; CONTRACTS.md "Operator endpoints",
"Peering")::

    hotload operator [--namespace NS]... [--all-namespaces]
                     [--lease NAME [--lease-namespace NS] | --peering NAME | --standalone]
                     [--priority N] [--port 8080] [--log-format json|text]

The shell is the only place that reads the environment: ``KUBECONFIG`` (else the
in-cluster service account), ``POD_IP`` (where ``/healthz`` and ``/metrics`` bind; all
interfaces when unset), ``POD_NAME`` (the identity), ``POD_NAMESPACE`` (where the leader
Lease lives, unless ``--lease-namespace`` is given) and ``POD_UID`` (the peering priority,
unless ``--priority`` is given). SIGTERM stops it cleanly: a leader releases the Lease at
once, so its standby takes over without waiting for it to expire.
"""

from __future__ import annotations

import logging
import os
from enum import StrEnum

import typer

app = typer.Typer()


class LogFormat(StrEnum):
    JSON = "json"
    TEXT = "text"


@app.command("operator")
def operator(
    namespace: list[str] = typer.Option(
        [],
        "--namespace",
        "-n",
        help="Watch namespaces matching this glob (kopf syntax, e.g. 'hl-*'); repeatable. "
        "Default: every namespace.",
    ),
    all_namespaces: bool = typer.Option(
        False, "--all-namespaces", "-A", help="Watch every namespace (the default)."
    ),
    lease: str | None = typer.Option(
        None,
        "--lease",
        help="Hold this coordination.k8s.io Lease to lead: only its holder writes, every "
        "write fenced by it (what the chart runs).",
    ),
    lease_namespace: str | None = typer.Option(
        None, "--lease-namespace", help="Namespace of the Lease (default: $POD_NAMESPACE)."
    ),
    peering: str | None = typer.Option(
        None,
        "--peering",
        help="Join this ClusterKopfPeering (one replica active, the others on standby; "
        "no fence: prefer --lease).",
    ),
    standalone: bool = typer.Option(False, "--standalone", help="Run without peering."),
    priority: int | None = typer.Option(
        None, "--priority", help="Peering priority (default: derived from $POD_UID)."
    ),
    port: int = typer.Option(8080, "--port", help="Port of /healthz and /metrics on $POD_IP."),
    log_format: LogFormat | None = typer.Option(
        None, "--log-format", help="json or text (default: json unless stderr is a terminal)."
    ),
) -> None:
    """Run the operator: rollouts, the per-replica ledger, chain validation, fallback to full.

    Runs until SIGTERM; /healthz and /metrics on $POD_IP:PORT.
    """
    from hotload import logs
    from hotload.errors import ConfigError
    from hotload.kube import kubeconfig_from
    from hotload.operator.options import operator_options
    from hotload.operator.runner import run_operator

    if log_format is not None:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        logs.configure(level, json_lines=log_format is LogFormat.JSON)
    try:
        options = operator_options(
            namespaces=namespace,
            all_namespaces=all_namespaces,
            peering=peering,
            standalone=standalone,
            priority=priority,
            port=port,
            environ=os.environ,
            lease=lease,
            lease_namespace=lease_namespace,
        )
    except ConfigError as err:
        raise typer.BadParameter(str(err)) from err
    run_operator(options, kubeconfig_from(os.environ), environ=os.environ)
