"""Pinned versions of the external tools the local regions run.

``hack/versions.env`` is the one place they are pinned; this module reads it when the
package runs from a checkout and falls back to the copy below when hotload is installed
without the repository. A test keeps the two equal, so they cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from hotload.errors import ConfigError

#: The same values as ``hack/versions.env`` (kept equal by a test).
EMBEDDED_VERSIONS: Final[dict[str, str]] = {
    "KUBERNETES_VERSION": "v1.35.4",
    "ETCD_VERSION": "v3.6.16",
    "KWOK_VERSION": "v0.8.0",
    "HELM_VERSION": "v4.3.1",
    "MINIO_VERSION": "v0.0.0-20260212201848-7aac2a2c5b7c",
    "TOXIPROXY_VERSION": "v2.5.0",
    "MC_VERSION": "v0.0.0-20250313080218-cf909e1063a9",
    "PROMETHEUS_VERSION": "v0.307.3",
}

#: Which pinned version each binary in the cache carries in its name (``NAME-VERSION``).
TOOL_VERSION_KEYS: Final[dict[str, str]] = {
    "etcd": "ETCD_VERSION",
    "kube-apiserver": "KUBERNETES_VERSION",
    "kube-controller-manager": "KUBERNETES_VERSION",
    "kube-scheduler": "KUBERNETES_VERSION",
    "kubectl": "KUBERNETES_VERSION",
    "kwok": "KWOK_VERSION",
    "helm": "HELM_VERSION",
    "minio": "MINIO_VERSION",
    "toxiproxy-server": "TOXIPROXY_VERSION",
    "mc": "MC_VERSION",
    "prometheus": "PROMETHEUS_VERSION",
}


def repo_root() -> Path | None:
    """The checkout this package runs from, when it runs from one (else None)."""
    candidate = Path(__file__).resolve().parents[2]
    if (candidate / "hack" / "versions.env").is_file():
        return candidate
    return None


def versions_env_path() -> Path | None:
    root = repo_root()
    return None if root is None else root / "hack" / "versions.env"


def parse_versions_env(text: str) -> dict[str, str]:
    """``KEY=value`` lines of a shell env file; comments and blank lines skipped."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError("malformed line in versions.env", line=number, text=raw)
        values[key.strip()] = value.strip().strip("'\"")
    return values


def load_versions() -> dict[str, str]:
    """Pinned versions: hack/versions.env in a checkout, else the embedded copy."""
    path = versions_env_path()
    if path is None:
        return dict(EMBEDDED_VERSIONS)
    return parse_versions_env(path.read_text())


def tool_version(name: str) -> str:
    """The pinned version of one cached binary (``kubectl`` → ``v1.35.4``)."""
    key = TOOL_VERSION_KEYS.get(name)
    if key is None:
        raise ConfigError("no pinned version for this tool", tool=name)
    versions = load_versions()
    if key not in versions:
        raise ConfigError("versions.env does not pin this tool", tool=name, key=key)
    return versions[key]
