"""The one list-and-watch loop (a reflector, as client-go calls it), read as raw JSON.

List a collection, then watch it from the list's ``resourceVersion``: each event goes to
``on_event``, bookmarks only move the version, and a watch the server ends is resumed
from the last version seen. A ``410 Gone`` (the version expired) lists again at once;
any other failure — the API, a malformed answer, a consumer's bug — lists again after
the shared backoff (:class:`hotload.retry.Backoff`), so an outage or an expired version
cannot hide a deletion: the consumer gets the whole set on every list (``on_list``) and
can tell what vanished. :class:`hotload.kube.cache.VersionedStore` is the one cache such
a consumer keeps.

The operator watches its replica pods with it (one per deployment, with the
deployment's label selector), each sidecar its RolloutDeployment (a field selector on
its name) and its own Pod, the local pod runtime its region's pods and Services.

``list_first=False`` skips the list: a watch from ``resourceVersion=0`` starts with the
objects as the API server's watch cache holds them (a synthetic ``ADDED`` each), which is
all a consumer of one object by name needs, and works where RBAC grants ``watch`` but not
``list`` (the sidecar's own Pod: :mod:`hotload.sidecar.pod_writer`). An expiry or a
failure then watches again the same way. Version ``0`` ("any"), not an unset version:
an unset one asks for a consistent start, which makes the API server fetch etcd's
revision and hold the watch until its cache has caught up — under load it waits 3 s,
then answers ``504 Too large resource version``, and at 1,000 sidecars those waits filled
the priority-and-fairness seats and turned into ~10,000 failed watches and 429s per
rollout (bench/propagation). The cache's state may lag by a moment; the events that follow
bring it up to date, and a consumer that compares versions (the pod writer) ignores the
older one.

Raw JSON, not the generated models: a JSON parse is a few hundredths of a millisecond
per object where a ``V1Pod`` costs about a millisecond (:mod:`hotload.kube.raw`), and
kopf's own watch costs ~1.5 ms of CPU per event (bench/propagation).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException

from hotload.errors import KubeError, KubeExpired
from hotload.kube.errors import kube_errors, map_api_exception
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

#: Server-side watch timeout, the shortest: each watch asks for between this and twice this
#: (:func:`watch_timeout_for`); the watch is simply resumed from the last version.
WATCH_TIMEOUT_S: Final = 240
GONE: Final = 410
#: The version a watch without a list starts from: whatever the watch cache holds, at once.
ANY_VERSION: Final = "0"

Obj = dict[str, Any]
OnList = Callable[[list[Obj], str], None]
"""Called with every object of a fresh list and the list's resourceVersion (never
without a list: ``list_first=False``)."""
OnEvent = Callable[[str, Obj], None]
"""Called with each watch event's type (ADDED, MODIFIED, DELETED) and object."""


def watch_timeout_for(minimum_s: int, rng: random.Random) -> int:
    """One watch request's ``timeoutSeconds``: between ``minimum_s`` and twice it, drawn per
    request, as client-go's reflector does (``minWatchTimeout * (1 + rand)``).

    Watches started together must not end together: a fleet's sidecars start within a
    minute of each other, and with one fixed timeout their 2,000 watches of a 1,000-replica
    region all ended and were opened again in the same seconds every 4 minutes — a burst
    of requests that priority and fairness refused (429) and that stalled whatever rollout
    it met (bench/propagation/one-region-1000/analysis.md)."""
    return int(minimum_s * (1.0 + rng.random()))


class Reflector:
    """Feeds ``on_list`` and ``on_event`` from ``path`` until cancelled.

    ``api`` is called for every request (a client rebuilt after a token rotation is
    used at once); ``params`` are the collection's query (``labelSelector``,
    ``fieldSelector``); ``listed`` is set after the first list (without a list: once
    the first watch answered).
    """

    def __init__(
        self,
        api: Callable[[], ApiClient],
        path: str,
        on_list: OnList | None,
        on_event: OnEvent,
        *,
        params: Sequence[tuple[str, str]] = (),
        list_first: bool = True,
        retry: RetryPolicy | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        context: Mapping[str, Any] | None = None,
        what: str = "list/watch",
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self.path = path
        self._on_list = on_list
        self._on_event = on_event
        self._params = list(params)
        self._list_first = list_first
        self._backoff = Backoff(retry or RetryPolicy())
        self._what = what
        """Names it in the log: ``<what> failed, retrying``."""
        self._watch_timeout_s = watch_timeout_s
        """The shortest watch; each asks for up to twice it (:func:`watch_timeout_for`)."""
        self._rng = rng or random.Random()
        self._context = {"path": path, **(context or {})}
        self.listed = asyncio.Event()
        self.lists = 0
        """How many times it listed, or without a list watched from the cache (the first sync,
        then after each expiry or failure)."""

    async def run(self) -> None:
        """List (unless ``list_first`` is off), then watch; forever (until cancelled)."""
        while True:
            try:
                version = await self._list() if self._list_first else None
                while True:
                    version = await self._watch(version)
                    self._backoff.reset()
            except KubeExpired:
                log.info("watch version expired, listing again", extra=self._context)
            except (KubeError, ValueError, KeyError, TypeError, OSError) as err:
                # A malformed answer or a consumer's bug must not leave the watcher deaf.
                delay = self._backoff.next_delay()
                log.warning(
                    f"{self._what} failed, retrying",
                    exc_info=not isinstance(err, KubeError),
                    extra={**self._context, "error": str(err), "retry_in_s": round(delay, 2)},
                )
                await asyncio.sleep(delay)

    async def _request(
        self, params: list[tuple[str, str]], timeout: aiohttp.ClientTimeout | float
    ) -> aiohttp.ClientResponse:
        response: aiohttp.ClientResponse = await self._api().call_api(
            self.path,
            "GET",
            query_params=params,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
        if response.status >= 300:
            try:
                payload = await response.read()
            finally:
                response.release()
            error = ApiException(status=response.status, reason=response.reason)
            error.body = payload
            raise map_api_exception(error, **self._context)
        return response

    async def _list(self) -> str:
        assert self._on_list is not None  # list_first needs it
        with kube_errors(**self._context):
            response = await self._request(self._params, 60.0)
            try:
                body = json.loads(await response.read())
            finally:
                response.release()
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self._on_list(list(body.get("items") or []), version)
        self.lists += 1
        self.listed.set()
        self._backoff.reset()
        return version

    async def _watch(self, version: str | None) -> str | None:
        """Watch from ``version`` (None: from :data:`ANY_VERSION`, the objects as the watch
        cache holds them first) until the server ends the stream; the last version seen."""
        timeout_s = watch_timeout_for(self._watch_timeout_s, self._rng)
        query = [
            *self._params,
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        if version is None:
            self.lists += 1
        query.append(("resourceVersion", ANY_VERSION if version is None else version))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)
        with kube_errors(**self._context):
            response = await self._request(query, timeout)
            self.listed.set()
            try:
                while True:
                    line = await response.content.readline()
                    if not line:
                        return version
                    if line.strip():  # an API server may send blank lines between events
                        version = self.handle(json.loads(line), version)
            finally:
                response.release()

    def handle(self, event: Mapping[str, Any], version: str | None) -> str | None:
        """One watch event: to ``on_event`` (bookmarks only move the version); the version
        now. ``KubeExpired`` for a 410 in the stream, ``KubeError`` for another error."""
        kind = str(event.get("type") or "")
        obj: Obj = dict(event.get("object") or {})
        if kind == "ERROR":
            code = obj.get("code")
            if code == GONE:
                raise KubeExpired("watch version expired", status=GONE, **self._context)
            message = f"watch error: {obj.get('message', '')}"
            raise KubeError(message, status=code, **self._context)
        seen = (obj.get("metadata") or {}).get("resourceVersion")
        new_version = str(seen) if seen else version
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._on_event(kind, obj)
        return new_version
