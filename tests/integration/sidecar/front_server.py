"""A real front (uvicorn, ``build_front``) over a real reference engine, for the perimeter
tests: raw HTTP/1.1 requests, so that no client normalises the path before the front sees it.

The front's source is a small stand-in for the agent (what the front reads: a real
``SwapGate``, real metrics, the real reference adapter pointed at the engine process);
the agent itself is tested through real pods elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from hotload.engines import Engine
from hotload.engines.reference_adapter import ReferenceEngine
from hotload.local.ports import free_port
from hotload.sidecar.front import build_front
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.status import AgentStatus, StatusReport
from hotload.sidecar.swap_gate import SwapGate
from hotload.waiting import wait_until

HOST = "127.0.0.1"
SERVED_NAME = "reference"
#: The test front's caps: small, so that refusals cost kilobytes, not megabytes.
MAX_REQUEST_BYTES = 32 * 1024
MAX_DEPTH = 12


@dataclass
class StandInAgent:
    """What the front reads from its agent, over a real engine adapter."""

    engine_url: str
    identity: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.metrics = AgentMetrics(self.registry)
        self.gate = SwapGate(self.metrics, hold_timeout_s=5.0, retry_after_s=1)
        self.engine = ReferenceEngine(self.engine_url)

    def current_engine(self) -> Engine | None:
        return self.engine

    def served_name(self) -> str | None:
        return SERVED_NAME

    def served_identity(self) -> str | None:
        return self.identity

    def status_report(self) -> StatusReport:
        return AgentStatus().report(
            pod="front-test", namespace="t", deployment="d", engine="reference", transition=None
        )


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class FrontServer:
    """``build_front`` served by uvicorn in a thread of its own, on a free loopback port."""

    def __init__(self, agent: StandInAgent, **limits: int) -> None:
        self.port = free_port(HOST)
        self._client = httpx.AsyncClient(timeout=30.0)
        app = build_front(agent, self._client, **limits)
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, host=HOST, port=self.port, log_config=None, access_log=False, lifespan="off"
            )
        )
        self._thread = threading.Thread(target=self._serve, name="front", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve())

    def __enter__(self) -> FrontServer:
        self._thread.start()
        if not wait_until(lambda: self._server.started, 30.0, interval_s=0.05):
            raise RuntimeError("the front did not start listening")
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def request(
        self,
        method: str,
        target: bytes | str,
        body: bytes = b"",
        *,
        headers: dict[str, str] | None = None,
        declared_length: int | None = None,
        timeout: float = 30.0,
    ) -> Answer:
        """One raw HTTP/1.1 request to this front (see :func:`raw_request`)."""
        return raw_request(
            HOST, self.port, method, target, body,
            headers=headers, declared_length=declared_length, timeout=timeout,
        )  # fmt: skip


def raw_request(
    host: str,
    port: int,
    method: str,
    target: bytes | str,
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    declared_length: int | None = None,
    timeout: float = 30.0,
) -> Answer:
    """One raw HTTP/1.1 request, the target sent byte for byte (no client normalises it).

    ``declared_length`` sends that Content-Length while sending only ``body``: the front
    must answer a body it will refuse without waiting for the rest.
    """
    raw_target = target.encode() if isinstance(target, str) else target
    length = len(body) if declared_length is None else declared_length
    lines = [
        method.encode() + b" " + raw_target + b" HTTP/1.1",
        f"host: {host}:{port}".encode(),
        b"connection: close",
        f"content-length: {length}".encode(),
        *(f"{k}: {v}".encode() for k, v in (headers or {}).items()),
    ]
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        # The front may answer and close before taking it all: read the answer then.
        with contextlib.suppress(OSError):
            sock.sendall(body)
        return _read_answer(sock)


def _read_answer(sock: socket.socket) -> Answer:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    if not status_line.startswith("HTTP/1.1 "):
        raise AssertionError(f"not an HTTP answer: {data[:200]!r}")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _unchunk(body)
    return Answer(int(status_line.split()[1]), headers, body)


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out
