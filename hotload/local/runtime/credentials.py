"""A pod's ServiceAccount credentials: a pod-bound token in a kubeconfig of its own.

A kubelet gives each container a token for the pod's ServiceAccount, bound to the pod
(TokenRequest with ``boundObjectRef`` kind Pod). Its user info then carries the pod's
name and uid (``authentication.kubernetes.io/pod-name``), so the chart's admission
policy can narrow writes to the caller's own pod, and RBAC applies exactly as in a
cluster: a test with a missing rule fails. The token goes into a per-pod kubeconfig
(given through ``KUBECONFIG``; a token must not share a kubeconfig with a client
certificate, which would win) with the apiserver on 127.0.0.1.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from hotload.errors import ConfigError
from hotload.local.runtime.atomic_files import atomic_write
from hotload.local.runtime.kube_rest import KubeRest


@dataclass(frozen=True)
class ClusterEndpoint:
    """Where the region's apiserver listens and the CA that signed its certificate."""

    server: str
    ca_pem: bytes = field(repr=False)

    @property
    def host(self) -> str:
        return urlsplit(self.server).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return urlsplit(self.server).port or 443


def cluster_endpoint(kubeconfig: Path, context: str | None) -> ClusterEndpoint:
    """The server and CA of ``context`` (the current context when None) in a kubeconfig."""
    try:
        config: Mapping[str, Any] = yaml.safe_load(kubeconfig.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError("cannot read the kubeconfig", path=str(kubeconfig)) from err
    name = context or config.get("current-context")
    contexts = {c["name"]: c.get("context", {}) for c in config.get("contexts") or []}
    if name not in contexts:
        raise ConfigError("no such context in the kubeconfig", path=str(kubeconfig), context=name)
    cluster_name = contexts[name].get("cluster")
    clusters = {c["name"]: c.get("cluster", {}) for c in config.get("clusters") or []}
    cluster = clusters.get(cluster_name)
    if not cluster or "server" not in cluster:
        raise ConfigError("the context's cluster has no server", context=name)
    if "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"])
    elif "certificate-authority" in cluster:
        ca_path = Path(cluster["certificate-authority"])
        if not ca_path.is_absolute():
            ca_path = kubeconfig.parent / ca_path
        ca = ca_path.read_bytes()
    else:
        raise ConfigError("the context's cluster has no certificate authority", context=name)
    return ClusterEndpoint(server=str(cluster["server"]), ca_pem=ca)


@dataclass(frozen=True)
class IssuedToken:
    token: str = field(repr=False)
    expires_at: datetime
    issued_at: datetime

    def renew_at(self) -> datetime:
        """When to ask again: at 80 % of the lifetime, as a kubelet does."""
        return self.issued_at + (self.expires_at - self.issued_at) * 0.8


def _parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


async def request_token(
    rest: KubeRest,
    pod: Mapping[str, Any],
    *,
    seconds: int,
    audience: str | None = None,
) -> IssuedToken:
    """A token for the pod's ServiceAccount, bound to the pod (TokenRequest API)."""
    metadata = pod["metadata"]
    namespace = metadata.get("namespace", "default")
    account = pod.get("spec", {}).get("serviceAccountName") or "default"
    spec: dict[str, Any] = {
        "expirationSeconds": seconds,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata["name"],
            "uid": metadata["uid"],
        },
    }
    if audience:
        spec["audiences"] = [audience]
    issued_at = datetime.now(UTC)
    answer = await rest.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    status = answer.get("status") or {}
    return IssuedToken(
        token=str(status["token"]),
        expires_at=_parse_time(str(status["expirationTimestamp"])),
        issued_at=issued_at,
    )


def pod_kubeconfig(endpoint: ClusterEndpoint, token: str | None, namespace: str) -> bytes:
    """A kubeconfig with the apiserver, its CA and (unless None) the pod's token only."""
    user: dict[str, Any] = {"token": token} if token is not None else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": endpoint.server,
                    "certificate-authority-data": base64.b64encode(endpoint.ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": "pod", "user": user}],
        "contexts": [
            {"name": "pod", "context": {"cluster": "local", "user": "pod", "namespace": namespace}}
        ],
        "current-context": "pod",
    }
    return yaml.safe_dump(config, sort_keys=False).encode()


def write_pod_kubeconfig(
    path: Path, endpoint: ClusterEndpoint, token: str | None, namespace: str
) -> None:
    atomic_write(path, pod_kubeconfig(endpoint, token, namespace), 0o600)
