"""Watch one RolloutDeployment through the real API: the shared reflector, by name.

The sidecar needs its deployment's spec (bucket, endpoint, engine, transition, policies)
and ``status.targetSnapshot``. A :class:`~hotload.kube.reflector.Reflector` lists the
object by name (a field selector, so the list carries a resourceVersion to watch from)
and watches from that version; bookmarks keep the version fresh, a ``410 Gone`` lists
again, any other error backs off with jitter and lists again — a version that does not
parse too (it is logged and skipped). Every observed state is handed to ``on_change``;
the watcher itself decides nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ApiClient
from pydantic import ValidationError

from hotload.api import GROUP, VERSION, RolloutDeployment
from hotload.api.rollout_deployment import PLURAL
from hotload.errors import KubeError
from hotload.kube.reflector import Reflector
from hotload.retry import RetryPolicy

log = logging.getLogger(__name__)


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
        self.namespace = namespace
        self.name = name
        self._on_change = on_change
        self._reflector = Reflector(
            lambda: api,
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
            self._listed,
            self._changed,
            params=[("fieldSelector", f"metadata.name={name}")],
            retry=retry,
            context=self._context(),
            what="deployment watch",
        )

    @property
    def lists(self) -> int:
        """How many times it listed (first sync plus re-lists after expiry): for tests."""
        return self._reflector.lists

    async def run(self) -> None:
        """List, then watch; forever (until cancelled)."""
        await self._reflector.run()

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

    def _listed(self, items: list[dict[str, Any]], version: str) -> None:
        self._on_change(self._parse(items[0] if items else None, version))

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "DELETED":
            self._on_change(DeploymentView(None, version))
        else:
            self._on_change(self._parse(obj, version))
