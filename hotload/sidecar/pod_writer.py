"""Keeps the agent's report on its own Pod true, whoever else writes to the Pod.

Level-triggered: the writer compares what the Pod holds with what the agent wants it to
say, and patches on any difference — after the agent's own transitions, and also when
another writer changed our annotations or our condition, or after an API server outage.
It re-reads the Pod every ``check_interval_s`` (jittered) and right after each failed
write; a patch's answer (the Pod as the server now holds it) counts as a read.

The annotations go as a JSON merge patch (keys merge one by one, ``null`` removes one:
the API server applies it without the strategic merge's schema walk), the condition as a
strategic-merge patch of ``pods/status`` (conditions merge by ``type``), so only our own
keys and our one condition type are ever touched. Loading
and serving never wait on the API server: :meth:`PodWriter.publish` only records what is
wanted.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from hotload.api.conditions import parse_time
from hotload.api.pod import CONDITION_SNAPSHOT_READY, SIDECAR_ANNOTATIONS
from hotload.errors import KubeError, KubeNotFound
from hotload.kube import kube_errors
from hotload.kube.raw import read_json
from hotload.retry import Backoff, RetryPolicy
from hotload.sidecar.pod_report import (
    PodAnnotations,
    ReadinessGate,
    annotation_patch,
    condition_patch,
)

log = logging.getLogger(__name__)

#: The annotations' patch type (RFC 7386): their values are strings, so it merges exactly
#: as a strategic merge would, for less of the API server's CPU.
MERGE_PATCH = "application/merge-patch+json"
#: How often the Pod is read back to catch other writers (each read is one GET).
DEFAULT_CHECK_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ObservedPod:
    """Our part of the Pod as the API server last showed it."""

    annotations: dict[str, str]
    """Our annotations only (``hotload.dev/*`` keys the sidecar writes)."""
    gate_status: bool | None
    gate_reason: str | None
    gate_message: str | None
    gate_transition: datetime | None
    uid: str | None


def _observed(pod: Mapping[str, Any]) -> ObservedPod:
    """Our part of a Pod from its JSON (read or patch answers are not decoded into the
    client's models: a thousand agents in one shared host would spend a millisecond each)."""
    metadata = pod.get("metadata") or {}
    annotations = {
        key: value
        for key, value in (metadata.get("annotations") or {}).items()
        if key in SIDECAR_ANNOTATIONS and isinstance(value, str)
    }
    status: bool | None = None
    reason = message = None
    transition: datetime | None = None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION_SNAPSHOT_READY:
            status = condition.get("status") == "True"
            reason, message = condition.get("reason"), condition.get("message")
            transition = parse_time(condition.get("lastTransitionTime"))
    uid = metadata.get("uid")
    return ObservedPod(annotations, status, reason, message, transition, uid)


def annotations_differ(wanted: PodAnnotations, observed: ObservedPod) -> bool:
    """True when the Pod's annotations are not exactly what we want on it."""
    values = wanted.values()
    return any(observed.annotations.get(key) != value for key, value in values.items())


def gate_differs(wanted: ReadinessGate, observed: ObservedPod) -> bool:
    return (observed.gate_status, observed.gate_reason, observed.gate_message) != (
        wanted.ready,
        wanted.reason,
        wanted.message,
    )


class PodWriter:
    """Background writer of one Pod's annotations and ``hotload.dev/SnapshotReady``."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        retry: RetryPolicy,
        *,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
    ) -> None:
        # Any: the calls pass the client's private _preload_content option.
        self._core: Any = CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._backoff = Backoff(retry)
        self.check_interval_s = check_interval_s
        self._wanted_annotations: PodAnnotations | None = None
        self._wanted_gate: ReadinessGate | None = None
        self._observed: ObservedPod | None = None
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._rng = random.Random()
        self.patches = 0
        """Patches sent (annotations and condition): for tests and the scale benchmark."""
        self.repairs = 0
        """Patches that repaired a difference someone else made (not our own transition)."""

    def _context(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "pod": self.name}

    @property
    def observed(self) -> ObservedPod | None:
        return self._observed

    async def observe(self) -> ObservedPod:
        """Read the Pod (a restarted sidecar resumes its report from it)."""
        with kube_errors(**self._context()):
            pod = await read_json(
                self._core.read_namespaced_pod(self.name, self.namespace, _preload_content=False)
            )
        self._observed = _observed(pod)
        return self._observed

    def publish(self, annotations: PodAnnotations, gate: ReadinessGate) -> None:
        """Ask for this report to be on the Pod (soon, in the background)."""
        if not annotations.same_content(self._wanted_annotations):
            self._wanted_annotations = annotations
        self._wanted_gate = gate
        if self._differs(self._observed):
            self._idle.clear()
            self._changed.set()

    async def settled(self) -> None:
        """Wait until everything published so far is written (shutdown and tests)."""
        await self._idle.wait()

    def _differs(self, observed: ObservedPod | None) -> bool:
        if observed is None:
            return self._wanted_annotations is not None or self._wanted_gate is not None
        annotations, gate = self._wanted_annotations, self._wanted_gate
        return (annotations is not None and annotations_differ(annotations, observed)) or (
            gate is not None and gate_differs(gate, observed)
        )

    def _next_check(self) -> float:
        return self.check_interval_s * self._rng.uniform(0.8, 1.2)

    async def run(self) -> None:
        """Keep the Pod saying what is wanted, until cancelled."""
        read_back = self._observed is None
        while True:
            if not read_back:
                try:
                    async with asyncio.timeout(self._next_check()):
                        await self._changed.wait()
                except TimeoutError:
                    read_back = True
            self._changed.clear()
            try:
                if read_back:
                    await self.observe()
                    read_back = False
                own_change = self._idle.is_set() is False
                if self._differs(self._observed):
                    await self._write(repair=not own_change)
                self._backoff.reset()
                if not self._changed.is_set():
                    self._idle.set()
            except KubeNotFound:
                log.warning("own pod is gone; nothing to report on", extra=self._context())
                self._observed = None
                self._idle.set()
                await asyncio.sleep(self._next_check())
                read_back = True
            except KubeError as err:
                delay = self._backoff.next_delay()
                log.warning(
                    "writing the pod report failed, retrying",
                    extra={**self._context(), "error": str(err), "retry_in_s": round(delay, 2)},
                )
                await asyncio.sleep(delay)
                read_back = True

    async def _write(self, *, repair: bool) -> None:
        observed = self._observed
        assert observed is not None  # read just before
        annotations, gate = self._wanted_annotations, self._wanted_gate
        if annotations is not None and annotations_differ(annotations, observed):
            with kube_errors(**self._context(), write="annotations"):
                pod = await read_json(
                    self._core.patch_namespaced_pod(
                        self.name,
                        self.namespace,
                        annotation_patch(annotations),
                        _content_type=MERGE_PATCH,
                        _preload_content=False,
                    )
                )
            self._observed = observed = _observed(pod)
            self._count(repair, "annotations")
        if gate is not None and gate_differs(gate, observed):
            moment = observed.gate_transition
            if observed.gate_status != gate.ready or moment is None:
                moment = datetime.now(UTC)
            with kube_errors(**self._context(), write="condition"):
                pod = await read_json(
                    self._core.patch_namespaced_pod_status(
                        self.name,
                        self.namespace,
                        condition_patch(gate, moment),
                        _preload_content=False,
                    )
                )
            self._observed = _observed(pod)
            self._count(repair, "condition")

    def _count(self, repair: bool, what: str) -> None:
        self.patches += 1
        if repair:
            self.repairs += 1
            log.info(
                "pod report repaired (another writer changed it)",
                extra={**self._context(), "what": what},
            )
