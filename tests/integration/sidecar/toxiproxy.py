"""A toxiproxy-server (the pinned binary) between the sidecar and MinIO: outages, slowness.

The proxy's listener is the S3 endpoint the RolloutDeployment names; disabling the proxy
closes it (connections refused, open ones cut), a ``bandwidth`` toxic slows every
connection to a rate in KB/s, so a test can stop a download in the middle.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotload.local.ports import free_port
from hotload.local.tools import tool_path
from hotload.waiting import wait_until

HOST = "127.0.0.1"
#: Toxiproxy answers a toxic's removal only once every link has left the toxic's current
#: sleep (a ``bandwidth`` toxic sleeps per chunk), which on a busy machine takes seconds:
#: the same patience as hotload.local.wan's calls.
API_TIMEOUT_S = 30.0


@dataclass
class Toxiproxy:
    """One toxiproxy-server and the single proxy ``s3`` in front of an upstream."""

    api: str
    listen_port: int

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL clients use (through the proxy)."""
        return f"http://{HOST}:{self.listen_port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        response = httpx.request(method, f"{self.api}{path}", json=body, timeout=API_TIMEOUT_S)
        if response.status_code >= 300:
            raise AssertionError(
                f"toxiproxy {method} {path}: {response.status_code} {response.text}"
            )

    def create(self, upstream: str) -> None:
        self._call(
            "POST",
            "/proxies",
            {"name": "s3", "listen": f"{HOST}:{self.listen_port}", "upstream": upstream},
        )

    def enabled(self, on: bool) -> None:
        """Open (True) or close (False) the proxy's listener."""
        self._call("POST", "/proxies/s3", {"enabled": on})

    def slow(self, rate_kb_s: int) -> None:
        """Cap every connection's download rate (KB/s)."""
        self._call(
            "POST",
            "/proxies/s3/toxics",
            {
                "name": "slow",
                "type": "bandwidth",
                "stream": "downstream",
                "attributes": {"rate": rate_kb_s},
            },
        )

    def fast(self) -> None:
        self._call("DELETE", "/proxies/s3/toxics/slow")


@pytest.fixture
def toxiproxy(tmp_path: Path) -> Iterator[Toxiproxy]:
    """A private toxiproxy-server; the test creates its one proxy with ``create``."""
    api_port = free_port()
    log = (tmp_path / "toxiproxy.log").open("ab")
    process = subprocess.Popen(
        [str(tool_path("toxiproxy-server")), "-host", HOST, "-port", str(api_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://{HOST}:{api_port}"

    def answers() -> bool:
        try:
            if httpx.get(f"{api}/version", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise AssertionError(f"toxiproxy did not start; see {tmp_path / 'toxiproxy.log'}")
        return False

    if not wait_until(answers, 15, interval_s=0.1):
        raise AssertionError(f"toxiproxy did not start; see {tmp_path / 'toxiproxy.log'}")
    try:
        yield Toxiproxy(api, free_port())
    finally:
        process.terminate()
        process.wait(10)
        log.close()
