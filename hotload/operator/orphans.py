"""PolicySnapshots whose RolloutDeployment does not exist: say so on them.

A snapshot is reconciled by its deployment's reconciler; with a typo in
``spec.deploymentRef`` (or the deployment not created yet) nothing would ever write its
status and ``kubectl get psnap`` would show empty columns. After a grace period (the
deployment's reconciler may just be starting), a snapshot still without a reconciler and
without a phase gets ``phase: Pending`` and ``Ready=False``/``DeploymentNotFound``. When
the deployment appears, its reconciler takes the snapshot over and rewrites its status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from hotload.api import ConditionStatus, SnapshotPhase, reasons
from hotload.api.conditions import READY, DesiredCondition, merge_conditions
from hotload.errors import KubeError, NotLeader
from hotload.operator.executor import KubeExecutor

log = logging.getLogger(__name__)

GRACE_S: Final = 10.0


def orphan_status(body: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The status patch for a snapshot whose deployment is missing (None: leave it alone)."""
    status: Mapping[str, Any] = body.get("status") or {}
    if status.get("phase"):
        return None  # a reconciler wrote it (its deployment existed, or exists again)
    deployment = ((body.get("spec") or {}).get("deploymentRef") or {}).get("name", "")
    condition = DesiredCondition(
        READY,
        ConditionStatus.FALSE,
        reasons.DEPLOYMENT_NOT_FOUND,
        f"RolloutDeployment {deployment!r} does not exist in this namespace",
    )
    generation = (body.get("metadata") or {}).get("generation")
    return {
        "phase": SnapshotPhase.PENDING.value,
        "observedGeneration": generation,
        "conditions": merge_conditions(
            list(status.get("conditions") or []),
            [condition],
            observed_generation=generation,
            now=now,
        ),
    }


class OrphanWatch:
    """Checks snapshots of deployments without a reconciler once their grace has passed."""

    def __init__(
        self,
        executor: KubeExecutor,
        has_reconciler: Callable[[str, str], bool],
        grace_s: float = GRACE_S,
    ) -> None:
        self._executor = executor
        self._has_reconciler = has_reconciler
        self._grace_s = grace_s
        self._waiting: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        deployment = ((body.get("spec") or {}).get("deploymentRef") or {}).get("name", "")
        if event_type == "DELETED" or self._has_reconciler(key[0], deployment):
            self._waiting.pop(key, None)
            return
        if orphan_status(body, datetime.now(UTC)) is None:
            return
        first = key not in self._waiting
        self._waiting[key] = body
        if first:
            task = asyncio.get_running_loop().create_task(self._check_later(key, deployment))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _check_later(self, key: tuple[str, str], deployment: str) -> None:
        await asyncio.sleep(self._grace_s)
        body = self._waiting.pop(key, None)
        if body is None or self._has_reconciler(key[0], deployment):
            return
        patch = orphan_status(body, datetime.now(UTC))
        if patch is None:
            return
        version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        try:
            await self._executor.patch_snapshot_status(key[0], key[1], patch, version)
        except NotLeader:
            return  # the leader marks it
        except KubeError as err:
            log.warning(
                "could not mark a snapshot whose deployment is missing",
                extra={"namespace": key[0], "snapshot": key[1], "error": str(err)},
            )
            return
        log.info(
            "snapshot names a missing deployment",
            extra={"namespace": key[0], "snapshot": key[1], "deployment": deployment},
        )
