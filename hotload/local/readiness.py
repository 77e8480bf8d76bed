"""Ready checks for a region's processes, and waiting on a condition with a deadline."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from hotload.errors import LocalRegionError
from hotload.waiting import wait_until


@dataclass(frozen=True)
class HttpReady:
    """Ready when ``GET url`` answers 200 (and, if given, the body contains ``expect``).

    HTTPS endpoints are checked against the region's CA, with the admin client
    certificate when one is given (the apiserver's ``/readyz`` needs no more).
    """

    url: str
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    expect: str | None = None
    timeout_s: float = 2.0

    def _verify(self) -> ssl.SSLContext | bool:
        if self.ca_cert is None:
            return True
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if self.client_cert is not None and self.client_key is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def __call__(self) -> bool:
        try:
            response = httpx.get(self.url, verify=self._verify(), timeout=self.timeout_s)
        except (httpx.HTTPError, OSError, ssl.SSLError):
            return False
        if response.status_code != 200:
            return False
        return self.expect is None or self.expect in response.text

    def describe(self) -> str:
        return f"GET {self.url}" + (f" containing {self.expect!r}" if self.expect else "")


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float,
    *,
    interval_s: float = 0.25,
    **context: object,
) -> None:
    """Poll ``condition`` until it holds; at the deadline raise an error naming ``what``."""
    if not wait_until(condition, timeout_s, interval_s=interval_s):
        raise LocalRegionError(f"timed out after {timeout_s:.0f} s waiting for {what}", **context)
