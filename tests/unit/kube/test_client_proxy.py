"""The async Kubernetes client decides its proxy once, from the environment it is given.

Would catch: a session that still reads the process's proxy variables (or ``~/.netrc``) on
every request — two worker-thread hand-offs per request, ~10 % of a shared host's CPU at
1,000 agents — and a proxy the caller's environment names but the client ignores, or uses
for a host ``NO_PROXY`` excludes. Over HTTP with real sockets: a stand-in API server and a
stand-in forward proxy on loopback, each counting what reached it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio.client import VersionApi

from hotload.kube.client import async_api_client, proxy_for

VERSION = {
    "major": "1", "minor": "35", "gitVersion": "v1.35.4", "gitCommit": "0", "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.26", "compiler": "gc",
    "platform": "linux/amd64",
}  # fmt: skip


@pytest.mark.parametrize(
    ("server", "environ", "expected"),
    [
        ("https://10.0.0.1:6443", {}, None),
        ("https://10.0.0.1:6443", {"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        (
            "https://10.0.0.1:6443",
            {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:2"},
            "http://lower:1",
        ),
        ("https://10.0.0.1:6443", {"HTTP_PROXY": "http://proxy:3128"}, None),
        ("http://10.0.0.1:8080", {"HTTP_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        (
            "https://api.example.internal:6443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".example.internal"},
            None,
        ),
        (
            "https://10.0.0.1:6443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.1"},
            None,
        ),
        ("https://10.0.0.1:6443", {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "*"}, None),
        (
            "https://10.96.0.1:443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "localhost, 10.96.0.0/12"},
            None,
        ),
        (
            "https://10.200.0.1:443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.96.0.0/12,example.internal"},
            "http://proxy:3128",
        ),
        (
            "https://kubernetes.default.svc:443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "svc,.cluster.local"},
            None,
        ),
        (
            "https://notexample.internal:6443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "example.internal"},
            "http://proxy:3128",
        ),
        (
            "https://10.0.0.1:6443",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.2,other"},
            "http://proxy:3128",
        ),
    ],
)
def test_the_proxy_follows_the_variables_and_no_proxy(
    server: str, environ: Mapping[str, str], expected: str | None
) -> None:
    assert proxy_for(server, environ) == expected


class _Counting:
    """A loopback HTTP server that answers every GET with a version (directly, or as a
    forward proxy would) and records each request line's target: a path when the client
    came directly, the absolute URL when it came through a proxy."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.targets.append(request.raw_path)  # absolute when sent to a proxy
        return web.json_response(VERSION)


@contextlib.asynccontextmanager
async def _serving(
    handle: Callable[[web.Request], Awaitable[web.Response]],
) -> AsyncIterator[str]:
    """A loopback HTTP server answering every GET with ``handle``; yields its URL."""
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def servers() -> AsyncIterator[tuple[_Counting, _Counting]]:
    async with contextlib.AsyncExitStack() as stack:
        made = []
        for _ in range(2):
            counting = _Counting()
            counting.url = await stack.enter_async_context(_serving(counting.handle))
            made.append(counting)
        yield made[0], made[1]


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def test_requests_go_through_the_proxy_the_given_environment_names(
    tmp_path: Path, servers: tuple[_Counting, _Counting]
) -> None:
    api_server, proxy = servers
    client = await async_api_client(
        _kubeconfig(tmp_path, api_server.url), environ={"HTTP_PROXY": proxy.url}
    )
    try:
        for _ in range(3):
            version = await VersionApi(client).get_code()
            assert version.git_version == "v1.35.4"
    finally:
        await client.close()
    assert proxy.targets == [f"{api_server.url}/version/"] * 3
    assert api_server.targets == []


async def test_the_process_environment_is_not_read_per_request(
    tmp_path: Path, servers: tuple[_Counting, _Counting], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's own variables name a proxy after the client was built, and ``~/.netrc``
    would name credentials: neither reaches a request."""
    api_server, proxy = servers
    client = await async_api_client(_kubeconfig(tmp_path, api_server.url), environ={})
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login intruder password secret\n")
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    try:
        await VersionApi(client).get_code()
        assert client.rest_client.pool_manager.trust_env is False
    finally:
        await client.close()
    assert api_server.targets == ["/version/"]
    assert proxy.targets == []


class _Peers:
    """A loopback HTTP server that answers every GET with a version and records the
    client's port of each request's connection (a new port is a new connection)."""

    def __init__(self) -> None:
        self.ports: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append(peer[1] if peer else -1)
        return web.json_response(VERSION)


async def test_an_idle_connection_is_reused_for_the_next_report_not_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sidecar reports once per snapshot, tens of seconds apart: a connection idle 60 s is
    still reused (aiohttp alone drops it after 15 s: a TLS handshake per report), and one
    idle past the API server's 90 s idle timeout is not offered again. The pool's clock is
    moved, not waited for."""
    peers = _Peers()
    now = [1000.0]
    monkeypatch.setattr("aiohttp.connector.monotonic", lambda: now[0])
    async with _serving(peers.handle) as url:
        client = await async_api_client(_kubeconfig(tmp_path, url), environ={})
        try:
            await VersionApi(client).get_code()
            now[0] += 60
            await VersionApi(client).get_code()
            now[0] += 95
            await VersionApi(client).get_code()
        finally:
            await client.close()
    first, after_60_s, after_95_s = peers.ports
    assert after_60_s == first
    assert after_95_s != first
