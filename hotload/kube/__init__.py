"""Kubernetes client loading and API error mapping (KUBECONFIG, else in-cluster).

The only module that turns the client libraries' ``ApiException`` into hotload's
``KubeError`` family; every caller goes through :func:`kube_errors` or
:func:`map_api_exception`.
"""

from hotload.kube.client import async_api_client, kubeconfig_from, sync_api_client
from hotload.kube.errors import API_EXCEPTIONS, kube_errors, map_api_exception

__all__ = [
    "API_EXCEPTIONS",
    "async_api_client",
    "kube_errors",
    "kubeconfig_from",
    "map_api_exception",
    "sync_api_client",
]
