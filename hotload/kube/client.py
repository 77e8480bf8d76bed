"""Kubernetes API clients: ``KUBECONFIG`` when it is set, else the in-cluster config.

Each call builds its own ``Configuration`` and ``ApiClient`` and never touches the client
libraries' process-wide default: the pod runtime's shared mode runs many agents in one
process, each with its own pod-bound token. The shells read ``KUBECONFIG`` from the
environment and pass it here (:func:`kubeconfig_from`); nothing below them reads env.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import kubernetes.client
import kubernetes.config
import kubernetes_asyncio.client
import kubernetes_asyncio.config

from hotload.errors import ConfigError


def kubeconfig_from(environ: Mapping[str, str]) -> Path | None:
    """The kubeconfig file named by ``KUBECONFIG`` (its first entry), or None for in-cluster."""
    value = environ.get("KUBECONFIG", "")
    first = next((part for part in value.split(":") if part), None)
    return Path(first) if first else None


async def async_api_client(
    kubeconfig: Path | None, *, context: str | None = None
) -> kubernetes_asyncio.client.ApiClient:
    """An async client for ``kubeconfig``, or for the in-cluster service account when None.

    The caller owns the client and closes it (``await client.close()``).
    """
    configuration = type.__call__(kubernetes_asyncio.client.Configuration)
    try:
        if kubeconfig is not None:
            await kubernetes_asyncio.config.load_kube_config(
                config_file=str(kubeconfig),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            kubernetes_asyncio.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except (kubernetes_asyncio.config.ConfigException, OSError) as err:
        raise ConfigError(
            "cannot load Kubernetes client configuration",
            kubeconfig=str(kubeconfig) if kubeconfig else "in-cluster",
            error=str(err),
        ) from err
    return kubernetes_asyncio.client.ApiClient(configuration=configuration)


def sync_api_client(
    kubeconfig: Path | None, *, context: str | None = None
) -> kubernetes.client.ApiClient:
    """A sync client (for CLI code) built the same way as :func:`async_api_client`."""
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig is not None:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except (kubernetes.config.ConfigException, OSError) as err:
        raise ConfigError(
            "cannot load Kubernetes client configuration",
            kubeconfig=str(kubeconfig) if kubeconfig else "in-cluster",
            error=str(err),
        ) from err
    return kubernetes.client.ApiClient(configuration=configuration)
