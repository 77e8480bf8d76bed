"""Kubernetes API clients: ``KUBECONFIG`` when it is set, else the in-cluster config.

Each call builds its own ``Configuration`` and ``ApiClient`` and never touches the client
libraries' process-wide default: the pod runtime's shared mode runs many agents in one
process, each with its own pod-bound token. The shells read ``KUBECONFIG`` from the
environment and pass it here (:func:`kubeconfig_from`); nothing below them reads env.

**The proxy is resolved once, not per request.** kubernetes_asyncio opens its aiohttp
session with ``trust_env=True``, so aiohttp parses ``~/.netrc`` and reads the proxy
variables on *every* request, each in a worker thread: two thread hand-offs per request.
At 1,000 agents in one shared host that was ~10 % of the host's CPU during a rollout
(bench/propagation/one-region-1000/analysis.md). The async client here decides the proxy
when it is built — ``HTTPS_PROXY``/``HTTP_PROXY`` from the environment the shell passes,
unless ``NO_PROXY`` names the API server (:func:`proxy_for`), or the kubeconfig's own
``proxy-url`` — and its session no longer consults the environment. A pod's environment
does not change while it runs, so nothing a user sets is lost; ``~/.netrc`` was never a
way to authenticate to an API server (the kubeconfig's credentials are).

**An idle connection is kept 80 s, not aiohttp's 15 s.** A sidecar writes its pod once per
snapshot, tens of seconds apart: with a 15 s keep-alive every report opened a new TLS
connection, a full handshake on both ends — ~8 % of a 1,000-agent shared host's CPU and
~4 % of the API server's during a rollout (analysis.md, as above). The API server closes
connections idle for 90 s (``IdleTimeout`` in k8s.io/apiserver v0.35.4
``pkg/server/secure_serving.go:171``), so a client that keeps
one for 80 s hands it back first; client-go's transport keeps idle connections 90 s. The
cost is one open connection per client (its TLS read buffer, 256 KiB), within the 2 MB a
sidecar may use.
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import ip_address, ip_network
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
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


#: kubernetes_asyncio's read buffer for its session: a watch event carries a whole object,
#: up to etcd's 1.5 MiB request limit.
READ_BUFSIZE = 2**21

#: How long an idle connection stays in the pool for the next request: under the API
#: server's 90 s idle timeout, so the client closes first (see the module's docstring).
IDLE_CONNECTION_S = 80.0


def proxy_for(server: str, environ: Mapping[str, str]) -> str | None:
    """The proxy ``environ`` names for requests to ``server`` (the API server's URL), or
    None: ``https_proxy``/``HTTPS_PROXY`` (``http_...`` for a plain-HTTP server), lower case
    first as curl and Go read them, unless ``no_proxy``/``NO_PROXY`` covers the server's
    host (:func:`bypassed`)."""
    parts = urlsplit(server)
    scheme = parts.scheme or "https"
    proxy = environ.get(f"{scheme}_proxy") or environ.get(f"{scheme.upper()}_PROXY")
    if not proxy:
        return None
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    if parts.hostname and bypassed(parts.hostname, no_proxy):
        return None
    return proxy


def bypassed(host: str, no_proxy: str) -> bool:
    """Whether ``no_proxy`` (comma-separated) excludes ``host``, as Go's ``httpproxy`` reads
    it: ``*`` excludes everything, a name excludes itself and its subdomains (a leading dot
    optional), an address or a CIDR block excludes the addresses in it."""
    host = host.lower().strip("[]")
    try:
        address = ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if address is not None:
            try:
                if address in ip_network(entry.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = entry.lstrip(".").rpartition(":")[0] or entry.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def _session_without_env_lookups(client: kubernetes_asyncio.client.ApiClient) -> None:
    """Give the client's REST layer the same connection pool in a session that does not
    read ``~/.netrc`` and the proxy variables on each request, keeping idle connections
    :data:`IDLE_CONNECTION_S` (see the module's docstring).
    """
    rest = client.rest_client
    session: aiohttp.ClientSession = rest.pool_manager
    connector = session.connector
    assert connector is not None  # kubernetes_asyncio always hands its session one
    # aiohttp has no setter; the connector is new and has pooled nothing yet.
    connector._keepalive_timeout = IDLE_CONNECTION_S
    session.detach()  # closed, without closing the connector the new session takes over
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )


async def async_api_client(
    kubeconfig: Path | None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> kubernetes_asyncio.client.ApiClient:
    """An async client for ``kubeconfig``, or for the in-cluster service account when None.

    ``environ`` is where the proxy variables are read, once (:func:`proxy_for`): the
    shell's environment, or a shared pod's; None uses no proxy but the kubeconfig's.
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
    if not configuration.proxy and environ is not None:
        configuration.proxy = proxy_for(configuration.host, environ)
    client = kubernetes_asyncio.client.ApiClient(configuration=configuration)
    _session_without_env_lookups(client)
    return client


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
