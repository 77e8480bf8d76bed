"""Watch one RolloutDeployment through the real API: the shared reflector, by name.

The sidecar needs its deployment's spec (bucket, endpoint, engine, transition, policies)
and ``status.targetSnapshot``. A :class:`~hotload.kube.reflector.Reflector` lists the
object by name (a field selector, so the list carries a resourceVersion to watch from)
and watches from that version; bookmarks keep the version fresh, a ``410 Gone`` lists
again, any other error backs off with jitter and lists again — a version that does not
parse too (it is logged and skipped). Every observed state that differs from the last one
handed on in what a sidecar acts on (:func:`sidecar_fields`) is handed to ``on_change``;
the watcher itself decides nothing.

Why the filter: every sidecar of a deployment watches the same object, and the operator
writes its status several times per rollout (replica counts, conditions, its fence). At
1,000 replicas each such write woke 1,000 agents for a full reconcile pass (an engine
observation, a plan, a report) for fields none of them reads — ~8,000 wasted passes per
delta (bench/propagation/one-region-1000/analysis.md). The agent's own periodic pass still
runs, so skipping an event never hides a state: it only declines to act twice on one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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


def sidecar_fields(raw: Mapping[str, Any]) -> tuple[object, ...]:
    """The parts of a deployment object a sidecar acts on: its identity, its whole spec, and
    of the status only the target (with its ``switchAt``) and the rollback record.

    Compared with ``==`` (deep, on the decoded JSON), so any change inside them counts,
    whether or not the API server bumped ``generation``. Keep in step with what
    :mod:`hotload.sidecar` reads of the deployment (``status.targetSnapshot``,
    ``status.rollback``, ``spec``).
    """
    metadata = raw.get("metadata") or {}
    status = raw.get("status") or {}
    return (
        metadata.get("uid"),
        raw.get("spec"),
        status.get("targetSnapshot"),
        status.get("rollback"),
    )


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
        self._handed: tuple[object, ...] | None = None
        self.unchanged = 0
        """Events skipped because nothing a sidecar acts on changed (for tests and benches)."""
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
        """A (re)list is always handed on: rare, and the state it carries is the truth."""
        raw = items[0] if items else None
        view = self._parse(raw, version)
        self._handed = sidecar_fields(raw) if raw is not None else None
        self._on_change(view)

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "DELETED":
            self._handed = None
            self._on_change(DeploymentView(None, version))
            return
        fields = sidecar_fields(obj)
        if fields == self._handed:
            self.unchanged += 1
            return
        view = self._parse(obj, version)
        self._handed = fields
        self._on_change(view)
