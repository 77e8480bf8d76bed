"""Writes the agent's report on its own Pod, coalescing bursts, retrying failures.

The client sends a dict body to a Pod's PATCH as a strategic-merge patch (its content
type for pods): annotations merge key by key (``null`` removes one) and conditions merge
by ``type``, so only our own keys and our one condition type are ever touched.

The agent sets the desired annotations and readiness gate at every transition and moves
on; this writer patches the Pod in the background, the newest desired state only (a
burst of transitions becomes one patch each for annotations and condition), and only
what differs from what it last wrote. Loading and serving never wait on the API server.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from hotload.api.pod import CONDITION_SNAPSHOT_READY, SIDECAR_ANNOTATIONS
from hotload.errors import KubeError, KubeNotFound
from hotload.kube import kube_errors
from hotload.retry import Backoff, RetryPolicy
from hotload.sidecar.pod_report import (
    PodAnnotations,
    ReadinessGate,
    annotation_patch,
    condition_patch,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ObservedPod:
    """What the Pod said when the agent started (a restart picks up from there)."""

    annotations: dict[str, str]
    gate_status: bool | None
    gate_transition: datetime | None
    uid: str | None


class PodWriter:
    """Background writer of one Pod's annotations and ``hotload.dev/SnapshotReady``."""

    def __init__(self, api: ApiClient, namespace: str, name: str, retry: RetryPolicy) -> None:
        self._core = CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._backoff = Backoff(retry)
        self._wanted_annotations: PodAnnotations | None = None
        self._wanted_gate: ReadinessGate | None = None
        self._written_annotations: PodAnnotations | None = None
        self._written_gate: ReadinessGate | None = None
        self._gate_transition: datetime | None = None
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.patches = 0
        """Patches sent (annotations and condition): for tests and the scale benchmark."""

    def _context(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "pod": self.name}

    async def observe(self) -> ObservedPod:
        """Read the Pod once (a restarted sidecar resumes its report from it)."""
        with kube_errors(**self._context()):
            pod = await self._core.read_namespaced_pod(self.name, self.namespace)
        annotations = {
            key: value
            for key, value in (pod.metadata.annotations or {}).items()
            if key in SIDECAR_ANNOTATIONS
        }
        gate_status: bool | None = None
        gate_transition: datetime | None = None
        for condition in (pod.status.conditions if pod.status else None) or []:
            if condition.type == CONDITION_SNAPSHOT_READY:
                gate_status = condition.status == "True"
                gate_transition = condition.last_transition_time
        if gate_status is not None:
            self._gate_transition = gate_transition
            self._written_gate = ReadinessGate(gate_status, "", "")
        return ObservedPod(annotations, gate_status, gate_transition, pod.metadata.uid)

    def publish(self, annotations: PodAnnotations, gate: ReadinessGate) -> None:
        """Ask for this report to be written (soon, in the background)."""
        if not annotations.same_content(self._wanted_annotations):
            self._wanted_annotations = annotations
        self._wanted_gate = gate
        self._idle.clear()
        self._changed.set()

    async def settled(self) -> None:
        """Wait until everything published so far is written (shutdown and tests)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write what is wanted, whenever it changes, until cancelled."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._write_pending()
                self._backoff.reset()
                if not self._changed.is_set():
                    self._idle.set()
            except KubeNotFound:
                log.warning("own pod is gone; nothing to report on", extra=self._context())
                self._idle.set()
            except KubeError as err:
                delay = self._backoff.next_delay()
                log.warning(
                    "writing the pod report failed, retrying",
                    extra={**self._context(), "error": str(err), "retry_in_s": round(delay, 2)},
                )
                await asyncio.sleep(delay)
                self._changed.set()

    async def _write_pending(self) -> None:
        annotations = self._wanted_annotations
        if annotations is not None and not annotations.same_content(self._written_annotations):
            with kube_errors(**self._context(), write="annotations"):
                await self._core.patch_namespaced_pod(
                    self.name,
                    self.namespace,
                    annotation_patch(annotations),
                )
            self._written_annotations = annotations
            self.patches += 1
        gate = self._wanted_gate
        if gate is not None and gate != self._written_gate:
            previous = self._written_gate
            moment = self._gate_transition
            if previous is None or previous.ready != gate.ready or moment is None:
                moment = datetime.now(UTC)
            with kube_errors(**self._context(), write="condition"):
                await self._core.patch_namespaced_pod_status(
                    self.name,
                    self.namespace,
                    condition_patch(gate, moment),
                )
            self._written_gate = gate
            self._gate_transition = moment
            self.patches += 1
