"""Readiness, liveness and startup probes, run against the pod's own address.

As a kubelet does: ``httpGet`` succeeds on a status in [200, 400); ``tcpSocket`` when
the port accepts a connection. A probe waits ``initialDelaySeconds``, then runs every
``periodSeconds`` with ``timeoutSeconds``; ``successThreshold``/``failureThreshold``
consecutive results flip its state. ``exec`` and ``grpc`` probes would run inside a
container image we do not have: they report failure with a message saying so, never a
silent success. Probe traffic goes to the pod's 127.x address only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeSpec:
    kind: str
    """``http``, ``tcp`` or ``unsupported``."""
    port: int = 0
    path: str = "/"
    host: str | None = None
    scheme: str = "http"
    headers: tuple[tuple[str, str], ...] = ()
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    detail: str = field(default="", compare=False)


def resolve_port(port: Any, container_ports: Sequence[Mapping[str, Any]]) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for declared in container_ports:
        if declared.get("name") == text:
            return int(declared["containerPort"])
    return 0


def parse_probe(probe: Mapping[str, Any], container: Mapping[str, Any]) -> ProbeSpec:
    timing = {
        "initial_delay_s": float(probe.get("initialDelaySeconds", 0)),
        "period_s": float(probe.get("periodSeconds", 10)),
        "timeout_s": float(probe.get("timeoutSeconds", 1)),
        "success_threshold": int(probe.get("successThreshold", 1)),
        "failure_threshold": int(probe.get("failureThreshold", 3)),
    }
    ports = container.get("ports") or []
    if "httpGet" in probe:
        action = probe["httpGet"]
        headers = tuple((str(h["name"]), str(h["value"])) for h in action.get("httpHeaders") or [])
        return ProbeSpec(
            "http",
            port=resolve_port(action.get("port"), ports),
            path=str(action.get("path", "/")),
            host=action.get("host"),
            scheme=str(action.get("scheme", "HTTP")).lower(),
            headers=headers,
            **timing,  # type: ignore[arg-type]
        )
    if "tcpSocket" in probe:
        action = probe["tcpSocket"]
        return ProbeSpec(
            "tcp",
            port=resolve_port(action.get("port"), ports),
            host=action.get("host"),
            **timing,  # type: ignore[arg-type]
        )
    kinds = sorted(k for k in ("exec", "grpc") if k in probe)
    return ProbeSpec(
        "unsupported",
        detail=f"{'/'.join(kinds) or 'this'} probe is not supported by the local pod runtime",
        **timing,  # type: ignore[arg-type]
    )


async def check(spec: ProbeSpec, pod_ip: str, client: httpx.AsyncClient) -> tuple[bool, str]:
    """Run one probe; (succeeded, message)."""
    host = spec.host or pod_ip
    if spec.kind == "http":
        url = f"{spec.scheme}://{host}:{spec.port}{spec.path}"
        try:
            response = await client.get(url, headers=dict(spec.headers), timeout=spec.timeout_s)
        except httpx.HTTPError as err:
            return False, f"GET {url}: {type(err).__name__}: {err}"
        ok = 200 <= response.status_code < 400
        return ok, f"GET {url}: HTTP {response.status_code}"
    if spec.kind == "tcp":
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, spec.port), timeout=spec.timeout_s
            )
        except (OSError, TimeoutError) as err:
            return False, f"tcp {host}:{spec.port}: {err}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True, f"tcp {host}:{spec.port}: open"
    return False, spec.detail


class ProbeLoop:
    """One probe of one container, from its start until cancelled.

    ``initial`` is the state before any result: False for readiness, True for liveness,
    None (unknown) for startup, so a startup probe that never succeeds still fails.
    """

    def __init__(
        self,
        spec: ProbeSpec,
        pod_ip: str,
        client: httpx.AsyncClient,
        on_change: Callable[[bool, str], Awaitable[None] | None],
        *,
        initial: bool | None,
        stop_on_success: bool = False,
    ) -> None:
        self.spec = spec
        self.pod_ip = pod_ip
        self.client = client
        self.on_change = on_change
        self.state = initial
        self.message = ""
        self._successes = 0
        self._failures = 0
        self._stop_on_success = stop_on_success

    async def run(self) -> None:
        await asyncio.sleep(self.spec.initial_delay_s)
        while True:
            ok, message = await check(self.spec, self.pod_ip, self.client)
            self.message = message
            if ok:
                self._successes, self._failures = self._successes + 1, 0
            else:
                self._successes, self._failures = 0, self._failures + 1
            flip = (
                ok and self.state is not True and self._successes >= self.spec.success_threshold
            ) or (
                not ok and self.state is not False and self._failures >= self.spec.failure_threshold
            )
            if flip:
                self.state = ok
                result = self.on_change(ok, message)
                if result is not None:
                    await result
                if ok and self._stop_on_success:
                    return
            await asyncio.sleep(self.spec.period_s)
