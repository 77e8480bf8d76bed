"""Raw JSON calls to the region's apiserver, with the runtime's admin credentials.

The runtime reads and writes pods by the thousand (scale runs); plain dicts keep that
cheap (no model deserialisation) and let it send exactly the patches it means
(strategic merge of ``pods/status`` with only its own condition types). The client is
``kubernetes_asyncio``'s, loaded by ``hotload.kube``; failures become hotload's
``KubeError`` family through the project's one mapping.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException

from hotload.kube import kube_errors, map_api_exception

log = logging.getLogger(__name__)

STRATEGIC_MERGE: Final = "application/strategic-merge-patch+json"
MERGE: Final = "application/merge-patch+json"
JsonObject = dict[str, Any]


class KubeRest:
    """A few verbs over one ``ApiClient``; the caller owns and closes the client."""

    def __init__(self, client: ApiClient, *, timeout_s: float = 30.0) -> None:
        self.client = client
        self.timeout_s = timeout_s

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout | float | None = None,
    ) -> aiohttp.ClientResponse:
        response: aiohttp.ClientResponse = await self.client.call_api(
            path,
            method,
            query_params=list(params),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout if timeout is not None else self.timeout_s,
        )
        if response.status >= 300:
            data = await response.read()
            response.release()
            err = ApiException(status=response.status, reason=response.reason)
            err.body = data
            raise map_api_exception(err, method=method, path=path)
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        """One call; the answer's JSON object."""
        with kube_errors(method=method, path=path):
            response = await self._send(
                method, path, params=params, body=body, content_type=content_type
            )
            try:
                data = await response.read()
            finally:
                response.release()
        parsed = json.loads(data) if data else {}
        return parsed if isinstance(parsed, dict) else {}

    async def get(self, path: str, **params: str) -> JsonObject:
        return await self.request("GET", path, params=list(params.items()))

    async def patch(
        self, path: str, body: Mapping[str, Any], *, content_type: str = STRATEGIC_MERGE
    ) -> JsonObject:
        return await self.request("PATCH", path, body=dict(body), content_type=content_type)

    async def post(self, path: str, body: Mapping[str, Any]) -> JsonObject:
        return await self.request("POST", path, body=dict(body))

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> JsonObject:
        return await self.request("DELETE", path, body=dict(body) if body else None)
