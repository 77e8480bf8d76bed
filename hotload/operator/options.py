"""How ``hotload operator`` runs: namespaces, peering, endpoints, logs.

The command line is agreed with the chart (README of the coordination, CONTRACTS.md
"Operator endpoints", "Peering", "Fencing"):
``hotload operator [--namespace NS]... [--all-namespaces]
[--lease NAME [--lease-namespace NS] | --peering NAME | --standalone]
[--priority N] [--port 8080] [--log-format json|text]``.

With ``--lease`` (what the chart runs) the region's leader Lease decides which replica
writes, and kopf runs without peering on every replica (its handlers only poke the
reconcilers, which wait for the Lease). ``--peering`` is kopf's peering alone: no fence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from hotload.api import pod as contract
from hotload.errors import ConfigError

DEFAULT_PORT: Final = 8080
ENV_POD_UID: Final = "POD_UID"
#: kopf priorities are compared as integers; 31 bits keep them a plain JSON int anywhere.
PRIORITY_BITS: Final = 31


def priority_from_uid(uid: str) -> int:
    """A stable, practically unique kopf priority for a pod (equal priorities freeze both)."""
    digest = hashlib.sha256(uid.encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << PRIORITY_BITS) - 1)


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()
    """kopf namespace globs (e.g. ``hl-*``); empty means every namespace."""
    peering: str | None = None
    """The ClusterKopfPeering to join (mandatory peering); None with ``standalone`` False
    means kopf's auto-detection (peering ``default`` when it exists)."""
    standalone: bool = False
    priority: int | None = None
    host: str = ""
    """Address of /healthz and /metrics: ``$POD_IP``, all interfaces when empty."""
    port: int = DEFAULT_PORT
    identity: str | None = None
    """This replica's name among its peers (``$POD_NAME`` in a pod)."""
    lease: str | None = None
    """The leader Lease's name (``coordination.k8s.io/v1``); None: no Lease."""
    lease_namespace: str = ""
    """Where the Lease lives (the operator's own namespace, ``$POD_NAMESPACE``)."""

    @property
    def cluster_wide(self) -> bool:
        return not self.namespaces

    @property
    def kopf_standalone(self) -> bool:
        """kopf runs without peering: ``--standalone``, or the Lease decides instead."""
        return self.standalone or self.lease is not None


def operator_options(
    *,
    namespaces: Sequence[str],
    all_namespaces: bool,
    peering: str | None,
    standalone: bool,
    priority: int | None,
    port: int,
    environ: Mapping[str, str],
    lease: str | None = None,
    lease_namespace: str | None = None,
) -> OperatorOptions:
    """Options from the command line and the pod's environment; usage errors are ConfigError."""
    if lease and (peering or standalone):
        raise ConfigError(
            "--lease excludes --peering and --standalone (the Lease decides who leads)",
            lease=lease,
        )
    lease_namespace = lease_namespace or environ.get(contract.ENV_POD_NAMESPACE) or ""
    if lease and not lease_namespace:
        raise ConfigError("--lease needs --lease-namespace (or $POD_NAMESPACE)", lease=lease)
    if all_namespaces and namespaces:
        raise ConfigError(
            "--namespace and --all-namespaces exclude each other", namespaces=list(namespaces)
        )
    if peering and standalone:
        raise ConfigError("--peering and --standalone exclude each other", peering=peering)
    if not 1 <= port <= 65535:
        raise ConfigError("--port must be between 1 and 65535", port=port)
    if any(not pattern.strip() for pattern in namespaces):
        raise ConfigError("--namespace must not be empty")
    uid = environ.get(ENV_POD_UID)
    if priority is None and uid:
        priority = priority_from_uid(uid)
    return OperatorOptions(
        namespaces=tuple(namespaces),
        peering=peering,
        standalone=standalone,
        priority=priority,
        host=environ.get(contract.ENV_POD_IP, ""),
        port=port,
        identity=environ.get(contract.ENV_POD_NAME) or None,
        lease=lease or None,
        lease_namespace=lease_namespace if lease else "",
    )
