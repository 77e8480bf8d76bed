"""Watch one RolloutDeployment through the real API: list, then watch from its version.

The sidecar needs its deployment's spec (bucket, endpoint, engine, transition, policies)
and ``status.targetSnapshot``. It lists the object by name (a field selector, so the list
carries a resourceVersion to watch from), then watches from that version; bookmarks keep
the version fresh, a ``410 Gone`` means the version expired and it lists again, any other
error backs off with jitter and retries. Every observed state is handed to ``on_change``;
the watcher itself decides nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ApiClient, ApiException, CustomObjectsApi
from pydantic import ValidationError

from hotload.api import GROUP, VERSION, RolloutDeployment
from hotload.api.rollout_deployment import PLURAL
from hotload.errors import KubeError, KubeExpired
from hotload.kube import kube_errors
from hotload.kube.errors import map_api_exception
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

#: Server-side watch timeout; the watch is simply restarted from the last version.
WATCH_TIMEOUT_S = 240


@dataclass(frozen=True)
class DeploymentView:
    """What the agent knows of its deployment at one resourceVersion."""

    deployment: RolloutDeployment | None
    """None when the object does not exist (not yet, or deleted)."""
    resource_version: str


class DeploymentWatcher:
    """Keeps ``on_change`` fed with the deployment's latest state until cancelled."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        retry: RetryPolicy,
        on_change: Callable[[DeploymentView], None],
    ) -> None:
        self._custom = CustomObjectsApi(api)
        self.namespace = namespace
        self.name = name
        self._on_change = on_change
        self._backoff = Backoff(retry)
        self.lists = 0
        """How many times it listed (first sync plus re-lists after expiry): for tests."""

    async def run(self) -> None:
        """List, then watch; forever (until cancelled)."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                version = await self._watch(version)
                self._backoff.reset()
            except KubeExpired:
                log.info("watch version expired, listing again", extra=self._context())
                version = None
            except KubeError as err:
                delay = self._backoff.next_delay()
                log.warning(
                    "deployment watch failed, retrying",
                    extra={**self._context(), "error": str(err), "retry_in_s": round(delay, 2)},
                )
                version = None
                await asyncio.sleep(delay)

    def _context(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "deployment": self.name}

    def _parse(self, raw: dict[str, Any] | None, version: str) -> DeploymentView:
        if raw is None:
            return DeploymentView(None, version)
        try:
            return DeploymentView(RolloutDeployment.model_validate(raw), version)
        except ValidationError as err:
            log.error(
                "deployment object does not parse; ignoring this version",
                extra={**self._context(), "error": str(err)},
            )
            raise KubeError("deployment does not parse", **self._context()) from err

    async def _list(self) -> str:
        with kube_errors(**self._context()):
            listing = await self._custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                field_selector=f"metadata.name={self.name}",
            )
        self.lists += 1
        version = str(listing["metadata"]["resourceVersion"])
        items = listing.get("items") or []
        self._on_change(self._parse(items[0] if items else None, version))
        return version

    async def _watch(self, version: str) -> str:
        """Watch from ``version`` until the server ends the stream; the last version seen."""
        with kube_errors(**self._context()):
            response = await self._custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                field_selector=f"metadata.name={self.name}",
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_S,
                _preload_content=False,
                _request_timeout=WATCH_TIMEOUT_S + 30,
            )
            try:
                if response.status >= 300:
                    # Unread, a refusal's body (an overloaded API server's 429 is plain text)
                    # would be taken for watch events; it is an error to retry.
                    error = ApiException(status=response.status, reason=response.reason)
                    error.body = await response.read()
                    raise map_api_exception(error, **self._context())
                while True:
                    line = await response.content.readline()
                    if not line:
                        return version
                    if line.strip():
                        version = self._handle(json.loads(line), version)
            finally:
                response.release()

    def _handle(self, event: dict[str, Any], version: str) -> str:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            message = obj.get("message", "")
            if code == 410:
                raise KubeExpired("watch version expired", status=410, **self._context())
            raise KubeError(f"watch error: {message}", status=code, **self._context())
        new_version = str(obj.get("metadata", {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return new_version
        if kind in ("ADDED", "MODIFIED"):
            self._on_change(self._parse(obj, new_version))
        elif kind == "DELETED":
            self._on_change(DeploymentView(None, new_version))
        return new_version
