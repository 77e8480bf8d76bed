"""``hotload local echo-server``: a small server that shows what a pod's world looks like.

Run as a container by the pod runtime (``command: [hotload, local, echo-server]``), it
binds ``$POD_IP`` (all interfaces only when unset, per the pod contract) and answers:

- ``GET /healthz`` → ``ok``;
- ``GET /stream?n=N`` → N server-sent events, one every 50 ms (streaming checks);
- ``GET /kube/<path>`` → the apiserver's answer to ``GET /<path>`` made with the pod's
  own credentials (``KUBECONFIG``): ``{"status": …, "body": …}``, so RBAC can be seen;
- ``GET /whoami`` → the pod's user info from a SelfSubjectReview (the token's claims);
- anything else → the pod's identity from its environment, the path and the session
  header, as JSON.

``--ignore-sigterm`` makes it ignore SIGTERM (to check the SIGKILL after the grace
period). Useful on its own to check a region: its answers say who served a request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from hotload.api.pod import (
    ENV_NODE_NAME,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    SESSION_HEADER,
)

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class PodCredentials:
    """The apiserver, its CA and the pod's token, from the pod's kubeconfig."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.server = str(cluster["server"])
        self.ca_pem = base64.b64decode(cluster["certificate-authority-data"])
        self.token = user.get("token")

    @contextlib.contextmanager
    def client(self) -> Iterator[httpx.Client]:
        with tempfile.NamedTemporaryFile(suffix=".crt") as ca:
            ca.write(self.ca_pem)
            ca.flush()
            context = ssl.create_default_context(cafile=ca.name)
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            with httpx.Client(
                base_url=self.server, verify=context, headers=headers, trust_env=False, timeout=10
            ) as client:
                yield client


class EchoApp:
    """The ASGI app; ``environ`` is the process environment, read once by the shell."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = dict(environ)

    def identity(self) -> dict[str, str | None]:
        env = self.environ
        return {
            "pod": env.get(ENV_POD_NAME),
            "namespace": env.get(ENV_POD_NAMESPACE),
            "ip": env.get(ENV_POD_IP),
            "node": env.get(ENV_NODE_NAME),
            "root": env.get("HOTLOAD_ROOT"),
            "pid": str(os.getpid()),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if path == "/healthz":
            await _respond(send, 200, b"ok", "text/plain")
        elif path == "/stream":
            await self._stream(scope, send)
        elif path.startswith("/kube/"):
            answer = await asyncio.to_thread(self._kube, "GET", path[len("/kube") :], None)
            await _respond_json(send, 200, answer)
        elif path == "/whoami":
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            answer = await asyncio.to_thread(
                self._kube, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review
            )
            await _respond_json(send, 200, answer)
        else:
            body = {**self.identity(), "path": path, "session": headers.get(SESSION_HEADER)}
            await _respond_json(send, 200, body)

    def _kube(self, method: str, path: str, body: Any) -> dict[str, Any]:
        kubeconfig = self.environ.get("KUBECONFIG")
        if not kubeconfig:
            return {"status": 0, "body": "no KUBECONFIG in this pod"}
        with PodCredentials(Path(kubeconfig)).client() as client:
            response = client.request(method, path, json=body)
        try:
            parsed: Any = response.json()
        except ValueError:
            parsed = response.text
        return {"status": response.status_code, "body": parsed}

    async def _stream(self, scope: Scope, send: Send) -> None:
        query = dict(
            part.split("=", 1) for part in scope["query_string"].decode().split("&") if "=" in part
        )
        count = int(query.get("n", "3"))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        for number in range(count):
            event = json.dumps({"n": number, "pod": self.environ.get(ENV_POD_NAME)})
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {event}\n\n".encode(),
                    "more_body": True,
                }
            )
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _respond_json(send: Send, status: int, value: Any) -> None:
    await _respond(send, status, json.dumps(value).encode(), "application/json")


class _Server(uvicorn.Server):
    """uvicorn without its signal capture: the shell decides what SIGTERM does."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(environ: Mapping[str, str], port: int, *, ignore_sigterm: bool) -> None:
    """Serve until SIGTERM (exit 0) or, with ``ignore_sigterm``, until killed."""
    host = environ.get(ENV_POD_IP) or "0.0.0.0"
    config = uvicorn.Config(
        EchoApp(environ), host=host, port=port, log_level="warning", lifespan="off"
    )
    server = _Server(config)
    loop = asyncio.get_running_loop()

    if not ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    loop.add_signal_handler(signal.SIGINT, lambda: setattr(server, "should_exit", True))
    log.info("echo server listening", extra={"host": host, "port": port})
    await server.serve()
