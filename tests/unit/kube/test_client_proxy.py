"""The async Kubernetes client decides its proxy once, from the environment it is given.

Would catch: a session that still reads the process's proxy variables (or ``~/.netrc``) on
every request — two worker-thread hand-offs per request, ~10 % of a shared host's CPU at
1,000 agents — and a proxy the caller's environment names but the client ignores, or uses
for a host ``NO_PROXY`` excludes. Over HTTP with real sockets: a stand-in API server and a
stand-in forward proxy on loopback, each counting what reached it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
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


@pytest.fixture
async def servers() -> AsyncIterator[tuple[_Counting, _Counting]]:
    runners = []
    made = []
    for _ in range(2):
        counting = _Counting()
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", counting.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        counting.url = f"http://127.0.0.1:{port}"
        runners.append(runner)
        made.append(counting)
    yield made[0], made[1]
    for runner in runners:
        await runner.cleanup()


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
