"""A Service's local port: an HTTP/1.1 reverse proxy over its Ready pods (asyncio streams).

One request per client connection: the proxy reads the request head, picks a backend
(:class:`Balancer`, affinity on ``x-multi-turn-session-id``), forwards the head with
``Connection: close`` and then pipes bytes both ways until the pod closes, so request
bodies of any framing and streamed responses (SSE) pass through as they come, with no
buffering. The response head gains ``Connection: close`` and ``x-hotload-pod`` (which
replica answered: handy for tests and the demo). No Ready pod: ``503``. A pod that
refuses the connection is skipped for the next one. Listens on 127.0.0.1 only and
connects only to pods' 127.x addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Final

from hotload.api.pod import SESSION_HEADER
from hotload.local.runtime.balancer import Balancer
from hotload.local.runtime.service_table import Backend

log = logging.getLogger(__name__)

HEAD_LIMIT: Final = 64 * 1024
CONNECT_TIMEOUT_S: Final = 5.0
POD_HEADER: Final = "x-hotload-pod"
_HOP_BY_HOP: Final = frozenset({b"connection", b"keep-alive", b"proxy-connection"})


def bind_socket(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0 for any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _split_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _join_head(first: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    return b"\r\n".join([first, *(name + b": " + value for name, value in headers)]) + b"\r\n\r\n"


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _closing(
    headers: Sequence[tuple[bytes, bytes]], extra: Sequence[tuple[bytes, bytes]] = ()
) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
    return [*kept, *extra, (b"Connection", b"close")]


def _simple_response(status: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None = None
) -> None:
    remaining = limit
    while remaining is None or remaining > 0:
        chunk = await reader.read(65536 if remaining is None else min(65536, remaining))
        if not chunk:
            break
        writer.write(chunk)
        await writer.drain()
        if remaining is not None:
            remaining -= len(chunk)


class ServiceListener:
    """The proxy of one service port."""

    def __init__(
        self,
        service: str,
        port_key: str,
        sock: socket.socket,
        backends: Callable[[], Sequence[Backend]],
    ) -> None:
        self.service = service
        self.port_key = port_key
        self.port = int(sock.getsockname()[1])
        self._sock = sock
        self._backends = backends
        self._balancer = Balancer()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self._sock, limit=HEAD_LIMIT)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2.0)
        self._sock.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._proxy(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _connect(
        self, session: str | None
    ) -> tuple[Backend, asyncio.StreamReader, asyncio.StreamWriter] | None:
        for backend in self._balancer.order(self._backends(), session):
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(backend.ip, backend.port, limit=HEAD_LIMIT),
                    timeout=CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError) as err:
                log.info(
                    "backend refused; trying the next",
                    extra={"service": self.service, "pod": backend.pod, "error": str(err)},
                )
                continue
            if session is not None:
                self._balancer.pin(session, backend)
            return backend, up_reader, up_writer
        return None

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, headers = _split_head(head)
        session_value = _header(headers, SESSION_HEADER.encode())
        session = session_value.decode("latin-1") if session_value else None
        connected = await self._connect(session)
        if connected is None:
            writer.write(
                _simple_response("503 Service Unavailable", f"no Ready pod behind {self.service}")
            )
            await writer.drain()
            return
        backend, up_reader, up_writer = connected
        try:
            up_writer.write(_join_head(request_line, _closing(headers)))
            await up_writer.drain()
            upload = asyncio.create_task(_pipe(reader, up_writer))
            try:
                await self._relay_response(backend, up_reader, writer, request_line)
            finally:
                upload.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await upload
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()

    async def _relay_response(
        self,
        backend: Backend,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request_line: bytes,
    ) -> None:
        while True:
            head = await up_reader.readuntil(b"\r\n\r\n")
            status_line, headers = _split_head(head)
            informational = status_line.split(b" ")[1:2] in ([b"100"], [b"102"], [b"103"])
            if informational:
                writer.write(head)
                await writer.drain()
                continue
            pod = (POD_HEADER.encode(), backend.pod.encode())
            writer.write(_join_head(status_line, _closing(headers, [pod])))
            await writer.drain()
            break
        if request_line.startswith(b"HEAD ") or status_line.split(b" ")[1:2] in (
            [b"204"],
            [b"304"],
        ):
            return
        length = _header(headers, b"content-length")
        chunked = (_header(headers, b"transfer-encoding") or b"").lower() == b"chunked"
        await _pipe(up_reader, writer, int(length) if length is not None and not chunked else None)
