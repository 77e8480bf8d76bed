"""HTTP to an engine's admin API: the one place httpx errors become ours.

Adapters build absolute URLs from their ``base_url`` so one shared ``httpx.AsyncClient``
(the sidecar's) can serve them all. Transport failures and timeouts become
``EngineUnavailable``; adapters decide what each HTTP status means for their engine.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx

from hotload.errors import EngineUnavailable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0


class AdminHttp:
    """A base URL, an ``httpx.AsyncClient`` (owned or borrowed) and optional bearer key."""

    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._owned = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def with_key(self, api_key: str | None) -> AdminHttp:
        """The same engine and client, another bearer key (SGLang wants its admin key on
        admin routes and its API key elsewhere); never closes the shared client."""
        return AdminHttp(self.base_url, self._client, api_key=api_key, timeout=self._timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int | float | list[str]] | None = None,
        timeout: float | None = None,
        retry_dropped: bool = False,
    ) -> httpx.Response:
        """Send one request; ``EngineUnavailable`` when the engine cannot be reached.

        ``retry_dropped``: send it once more when the connection broke before an answer
        came (an engine that closes its keep-alive connections after an error, as vLLM
        does after a failed reload: the next request on that connection is reset). Only
        for requests whose repetition does no harm (pause, resume, naming a version).
        """
        url = f"{self.base_url}{path}"
        attempts = 2 if retry_dropped else 1
        for attempt in range(attempts):
            try:
                return await self._client.request(
                    method,
                    url,
                    json=json,
                    params=params,
                    headers=self._headers,
                    timeout=timeout if timeout is not None else self._timeout,
                )
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError) as err:
                if attempt + 1 < attempts:
                    log.info(
                        "the engine dropped the connection; sending again",
                        extra={"url": url, "method": method, "error": type(err).__name__},
                    )
                    continue
                raise EngineUnavailable(
                    f"the engine cannot be reached: {type(err).__name__}", url=url, method=method
                ) from err
            except httpx.TimeoutException as err:
                raise EngineUnavailable(
                    "the engine did not answer in time",
                    url=url,
                    method=method,
                    timeout=timeout or self._timeout,
                ) from err
            except httpx.HTTPError as err:
                raise EngineUnavailable(
                    f"the engine cannot be reached: {type(err).__name__}", url=url, method=method
                ) from err
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        if self._owned:
            await self._client.aclose()


def response_detail(response: httpx.Response) -> str:
    """A short human reason from an error answer (FastAPI ``detail``, ``message``, or text)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        for field in ("detail", "message", "error", "error_message"):
            value = body.get(field)
            if value:
                return str(value)[:500]
    return str(body)[:500]


def json_object(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or an empty dict when it is not one."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
