"""A Service's local port over real sockets: Ready backends only, affinity, streaming."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from hotload.local.runtime.service_proxy import POD_HEADER, ServiceListener, bind_socket
from hotload.local.runtime.service_table import Backend

pytestmark = pytest.mark.timeout(30)


@dataclass
class FakePod:
    """A tiny HTTP/1.1 server that names itself; ``/stream`` waits for ``release``."""

    name: str
    server: asyncio.Server | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    bodies: list[bytes] = field(default_factory=list)

    async def start(self) -> Backend:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return Backend(f"ns/{self.name}", "127.0.0.1", port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if length:
            self.bodies.append(await reader.readexactly(length))
        if head.startswith(b"GET /stream"):
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            )
            writer.write(b"data: first\n\n")
            await writer.drain()
            await self.release.wait()
            writer.write(b"data: second\n\n")
        else:
            body = self.name.encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@contextlib.asynccontextmanager
async def listening(backends: Callable[[], list[Backend]]) -> AsyncIterator[str]:
    listener = ServiceListener("ns/svc", "http", bind_socket(0), backends)
    await listener.start()
    try:
        yield f"http://127.0.0.1:{listener.port}"
    finally:
        await listener.close()


async def test_no_ready_pod_answers_503() -> None:
    async with listening(lambda: []) as url, httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"{url}/")
    assert response.status_code == 503
    assert "ns/svc" in response.json()["error"]


async def test_requests_spread_over_ready_pods_and_say_which_answered() -> None:
    pods = [FakePod("p-0"), FakePod("p-1")]
    backends = [await pod.start() for pod in pods]
    async with listening(lambda: backends) as url, httpx.AsyncClient(trust_env=False) as client:
        answers = [(await client.get(f"{url}/")) for _ in range(4)]
    assert [a.text for a in answers] == ["p-0", "p-1", "p-0", "p-1"]
    assert [a.headers[POD_HEADER] for a in answers][:2] == ["ns/p-0", "ns/p-1"]
    for pod in pods:
        await pod.stop()


async def test_a_session_stays_on_its_pod_and_moves_when_the_pod_leaves() -> None:
    pods = [FakePod("p-0"), FakePod("p-1"), FakePod("p-2")]
    backends = [await pod.start() for pod in pods]
    ready = list(backends)
    headers = {"x-multi-turn-session-id": "conversation-7"}
    async with listening(lambda: ready) as url, httpx.AsyncClient(trust_env=False) as client:
        first = (await client.get(f"{url}/", headers=headers)).text
        for _ in range(5):
            await client.get(f"{url}/")
            assert (await client.get(f"{url}/", headers=headers)).text == first
        ready[:] = [b for b in backends if not b.pod.endswith(first)]
        moved = (await client.get(f"{url}/", headers=headers)).text
        assert moved != first
        assert (await client.get(f"{url}/", headers=headers)).text == moved
    for pod in pods:
        await pod.stop()


async def test_a_refusing_pod_is_skipped_for_the_next() -> None:
    alive = FakePod("alive")
    good = await alive.start()
    closed = bind_socket(0)
    dead = Backend("ns/dead", "127.0.0.1", closed.getsockname()[1])
    closed.close()  # nothing listens there any more: connections are refused
    async with listening(lambda: [dead, good]) as url, httpx.AsyncClient(trust_env=False) as client:
        answers = {(await client.get(f"{url}/")).text for _ in range(3)}
    assert answers == {"alive"}
    await alive.stop()


async def test_streamed_responses_pass_through_as_they_come() -> None:
    pod = FakePod("streamer")
    backend = await pod.start()
    async with (
        listening(lambda: [backend]) as url,
        httpx.AsyncClient(trust_env=False) as client,
        client.stream("GET", f"{url}/stream") as response,
    ):
        chunks = response.aiter_text()
        first = await asyncio.wait_for(chunks.__anext__(), timeout=5)
        assert "first" in first, "the first event arrives while the pod still holds the second"
        pod.release.set()
        rest = "".join([chunk async for chunk in chunks])
    assert "second" in rest
    await pod.stop()


async def test_request_bodies_reach_the_pod() -> None:
    pod = FakePod("p")
    backend = await pod.start()
    async with listening(lambda: [backend]) as url, httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(f"{url}/v1/completions", json={"prompt": "hi"})
    assert response.status_code == 200
    assert pod.bodies == [b'{"prompt":"hi"}']
    await pod.stop()
