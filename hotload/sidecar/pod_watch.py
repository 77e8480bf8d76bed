"""Watch the sidecar's own Pod by name, so other writers' changes are seen as they happen.

The report on the Pod is level-triggered: whoever changes our annotations or our
condition, the writer puts them back. Reading the Pod back on a timer would cost the API
server a GET per replica every few seconds for as long as it runs (100 reads a second for
a thousand replicas every 10 s), and still repair late. A watch costs nothing while
nobody writes and delivers every change at once: the API server's watch cache files a
watch with a ``metadata.name`` field selector under that name, so an event reaches this
one watcher, not every watcher of the namespace.

No list: a watch without a ``resourceVersion`` starts with the Pod as it is now (a
synthetic ``ADDED``), which is all the writer needs, and the sidecar's RBAC grants
``watch`` on pods but not ``list``. A watch the server ends (its timeout) resumes from the
last version seen; a ``410 Gone`` or any failure starts again from the Pod as it is (after
the shared backoff, capped low so an API server's return is noticed within seconds).
Every object seen goes to ``on_pod``; ``on_gone`` when the Pod is deleted.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException

from hotload.errors import KubeError, KubeExpired
from hotload.kube.errors import kube_errors, map_api_exception
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

#: Server-side watch timeout; the watch resumes from the last version seen.
WATCH_TIMEOUT_S: Final = 300
GONE: Final = 410

Obj = dict[str, Any]


class OwnPodWatch:
    """Feeds ``on_pod`` with every state of one Pod until cancelled (see the module doc)."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        retry: RetryPolicy,
        on_pod: Callable[[Obj], None],
        on_gone: Callable[[], None],
        *,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._api = api
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self._params = [("fieldSelector", f"metadata.name={name}")]
        self._on_pod = on_pod
        self._on_gone = on_gone
        self._backoff = Backoff(retry)
        self._watch_timeout_s = watch_timeout_s
        self._context = {"namespace": namespace, "pod": name}
        self.starts = 0
        """Watches started from the Pod as it is (the first, then after each failure)."""
        self.events = 0
        """Events seen (bookmarks not counted)."""

    async def run(self) -> None:
        """Watch, forever (until cancelled)."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    self.starts += 1
                version = await self._watch(version)
                self._backoff.reset()
            except KubeExpired:
                version = None
            except (KubeError, ValueError, KeyError, TypeError) as err:
                delay = self._backoff.next_delay()
                log.warning(
                    "own pod watch failed, watching again",
                    exc_info=not isinstance(err, KubeError),
                    extra={**self._context, "error": str(err), "retry_in_s": round(delay, 2)},
                )
                version = None
                await asyncio.sleep(delay)

    async def _watch(self, version: str | None) -> str | None:
        """Watch from ``version`` (None: from now, the Pod first) until the server ends
        the stream; the last version seen."""
        query = [
            *self._params,
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self._watch_timeout_s)),
        ]
        if version is not None:
            query.append(("resourceVersion", version))
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=self._watch_timeout_s + 30
        )
        with kube_errors(**self._context):
            response: aiohttp.ClientResponse = await self._api.call_api(
                self.path,
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout,
            )
            try:
                if response.status >= 300:
                    error = ApiException(status=response.status, reason=response.reason)
                    error.body = await response.read()
                    raise map_api_exception(error, **self._context)
                while line := await response.content.readline():
                    if line.strip():
                        version = self._handle(json.loads(line), version)
            finally:
                response.release()
        return version

    def _handle(self, event: Obj, version: str | None) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == GONE:
                raise KubeExpired("watch version expired", status=GONE, **self._context)
            raise KubeError(f"watch error: {obj.get('message', '')}", status=code, **self._context)
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or "") or version
        if kind in ("ADDED", "MODIFIED"):
            self.events += 1
            self._on_pod(obj)
        elif kind == "DELETED":
            self.events += 1
            self._on_gone()
        return new_version
