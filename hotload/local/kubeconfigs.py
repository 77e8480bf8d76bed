"""Kubeconfig files: one per region (what its components use) and one with a context per
region (what people and tests use: ``kubectl --context region-1``).

Credentials are embedded as data, so a kubeconfig keeps working when copied; the files
are written 0600 because they hold the admin key.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hotload.local.certificates import RegionCertificates


@dataclass(frozen=True)
class KubeconfigEntry:
    """One region as a kubeconfig sees it: cluster, admin user and context, all named after it."""

    name: str
    server: str
    certificates: RegionCertificates


def _data(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render(entries: Sequence[KubeconfigEntry], current: str | None = None) -> dict[str, Any]:
    """The kubeconfig object for ``entries`` (current context: ``current`` or the first)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {
                "name": entry.name,
                "cluster": {
                    "server": entry.server,
                    "certificate-authority-data": _data(entry.certificates.ca_cert),
                },
            }
            for entry in entries
        ],
        "users": [
            {
                "name": f"{entry.name}-admin",
                "user": {
                    "client-certificate-data": _data(entry.certificates.admin_cert),
                    "client-key-data": _data(entry.certificates.admin_key),
                },
            }
            for entry in entries
        ],
        "contexts": [
            {
                "name": entry.name,
                "context": {"cluster": entry.name, "user": f"{entry.name}-admin"},
            }
            for entry in entries
        ],
        "current-context": current or (entries[0].name if entries else ""),
    }


def write(path: Path, entries: Sequence[KubeconfigEntry], current: str | None = None) -> Path:
    """Write the kubeconfig atomically (temporary name, then rename), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(render(entries, current), handle, sort_keys=False)
    tmp.replace(path)
    return path
