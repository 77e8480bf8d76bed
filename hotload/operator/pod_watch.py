"""Each reconciler's own list+watch of its deployment's pods, read as raw JSON.

Why not kopf's ``@kopf.on.event`` for pods: kopf spends about 1.5 ms of CPU on every watch
event (its per-object queue, body views, loggers and handler kwargs), and a rollout makes
about three pod events per replica; at 1,000 replicas that is seconds of operator CPU per
snapshot on the same cores as the replicas (bench/propagation). A plain watch with the
deployment's label selector costs a JSON parse per event. It lives inside the
deployment's reconciler, which starts it afresh with each leadership tenure (so a standby
holds no pod watch), and it lists afresh after every error: an outage or an expired version
cannot hide a deletion.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from hotload.errors import KubeError, KubeExpired
from hotload.kube import kube_errors
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

#: Server-side watch timeout; the watch is simply restarted from the last version.
WATCH_TIMEOUT_S: Final = 240
GONE: Final = 410

Listed = Callable[[list[Mapping[str, Any]], str], None]
"""Called with every pod of a fresh list and the list's resourceVersion."""
Changed = Callable[[str, Mapping[str, Any]], None]
"""Called with each watch event's type and pod."""


class PodWatch:
    """Feeds ``on_list`` and ``on_event`` until cancelled; ``listed`` is set after a list."""

    def __init__(
        self,
        api: Callable[[], ApiClient],
        namespace: str,
        selector: str,
        on_list: Listed,
        on_event: Changed,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.selector = selector
        self._on_list = on_list
        self._on_event = on_event
        self._backoff = Backoff(retry or RetryPolicy())
        self.listed = asyncio.Event()
        self.lists = 0

    def _context(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "selector": self.selector}

    async def run(self) -> None:
        while True:
            try:
                version = await self._list()
                while True:
                    version = await self._watch(version)
                    self._backoff.reset()
            except KubeExpired:
                log.debug("pod watch version expired, listing again", extra=self._context())
            except KubeError as err:
                delay = self._backoff.next_delay()
                log.warning(
                    "pod watch failed, listing again",
                    extra={**self._context(), "error": str(err), "retry_in_s": round(delay, 2)},
                )
                await asyncio.sleep(delay)

    async def _list(self) -> str:
        core: Any = CoreV1Api(self._api())
        with kube_errors(**self._context()):
            response = await core.list_namespaced_pod(
                self.namespace, label_selector=self.selector, _preload_content=False
            )
            try:
                if response.status != 200:
                    raise KubeError(
                        f"listing pods answered {response.status}", status=response.status,
                        **self._context(),
                    )  # fmt: skip
                body = json.loads(await response.read())
            finally:
                response.release()
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self._on_list(list(body.get("items") or []), version)
        self.lists += 1
        self.listed.set()
        return version

    async def _watch(self, version: str) -> str:
        """Watch from ``version`` until the server ends the stream; the last version seen."""
        core: Any = CoreV1Api(self._api())
        with kube_errors(**self._context()):
            response = await core.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_S,
                _preload_content=False,
                _request_timeout=WATCH_TIMEOUT_S + 30,
            )
            try:
                if response.status == GONE:
                    raise KubeExpired("pod watch version expired", status=GONE, **self._context())
                if response.status != 200:
                    raise KubeError(
                        f"watching pods answered {response.status}", status=response.status,
                        **self._context(),
                    )  # fmt: skip
                while True:
                    line = await response.content.readline()
                    if not line:
                        return version
                    version = self._handle(json.loads(line), version)
            finally:
                response.release()

    def _handle(self, event: Mapping[str, Any], version: str) -> str:
        kind = str(event.get("type") or "")
        pod: Mapping[str, Any] = event.get("object") or {}
        if kind == "ERROR":
            code = pod.get("code")
            if code == GONE:
                raise KubeExpired("pod watch version expired", status=GONE, **self._context())
            raise KubeError(f"pod watch error: {pod.get('message', '')}", status=code,
                            **self._context())  # fmt: skip
        new_version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._on_event(kind, pod)
        return new_version
