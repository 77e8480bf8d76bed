"""What every engine reached over HTTP shares: its address, its health probe, the wait.

The reference, SGLang and vLLM adapters differ in how they load, pause and reset; they do
not differ in how one asks whether the engine is up or lets go of the connection, so
that lives here once.
"""

from __future__ import annotations

from typing import ClassVar

import httpx

from hotload.engines.admin_http import AdminHttp
from hotload.engines.readiness import poll_until_healthy
from hotload.errors import EngineUnavailable

HEALTH_TIMEOUT_S = 5.0


class HttpEngine:
    """Base of the HTTP adapters: ``base_url``, ``health()``, ``wait_ready()``, ``aclose()``."""

    health_path: ClassVar[str] = "/health"

    def __init__(
        self, base_url: str, client: httpx.AsyncClient | None = None, *, api_key: str | None = None
    ) -> None:
        self._http = AdminHttp(base_url, client, api_key=api_key)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def _health_http(self) -> AdminHttp:
        """The client (and key) the health route takes."""
        return self._http

    async def health(self) -> bool:
        """True when the engine answers its health route with 200."""
        try:
            response = await self._health_http().request(
                "GET", self.health_path, timeout=HEALTH_TIMEOUT_S
            )
        except EngineUnavailable:
            return False
        return response.status_code == 200

    async def wait_ready(self, timeout: float) -> None:
        await poll_until_healthy(self.health, timeout=timeout, url=self.base_url)

    async def aclose(self) -> None:
        """Close the HTTP client (only when this adapter created it)."""
        await self._http.aclose()
