"""Keeps the agent's report on its own Pod true, whoever else writes to the Pod.

Level-triggered: the writer compares what the Pod holds with what the agent wants it to
say, and patches on any difference — after the agent's own transitions, and also when
another writer changed our annotations or our condition, or after an API server outage.
It sees the Pod through a watch by name, a patch's answer (the Pod as the server now
holds it), and a read after a failed write.

**A watch, not reads.** Reading the Pod back on a timer would cost the API server a GET
per replica every few seconds for as long as it runs (100 reads a second for a thousand
replicas every 10 s), and still repair late. A watch costs nothing while nobody writes
and delivers every change at once: the API server's watch cache files a watch with a
``metadata.name`` field selector under that name, so an event reaches this one watcher.
It is the shared :class:`~hotload.kube.reflector.Reflector` without a list
(``list_first=False``): a watch from the API server's watch cache starts with the Pod as
the cache holds it, all the writer needs (an event older than the answer of our own last
patch is ignored: :func:`older`), and the sidecar's RBAC grants ``watch`` on pods but not
``list``.

**One write per report.** The whole report — the ``hotload.dev/*`` annotations and the
``hotload.dev/SnapshotReady`` condition — goes in one patch of ``pods/status`` (the API
server takes metadata changes there and keeps the spec as it was): a JSON merge patch of
the annotations when the condition is unchanged (keys merge one by one, ``null`` removes
one; no strategic merge's schema walk), a strategic-merge patch of both when the condition
changes (conditions merge by ``type``). Only our own keys and our one condition type are
ever touched.

**A quick load reports only its end.** While the only difference between the Pod and the
report is that the replica now works on a newer target (``state: Loading``, same
snapshot, same everything else: :func:`working_on_only`), the writer holds that write
back for ``loading_report_after_s`` (default :data:`DEFAULT_LOADING_REPORT_AFTER_S`) plus a
random spread of up to :data:`HOLD_SPREAD` of it (:func:`hold_for`): a load that ends sooner
writes only its ``Ready`` (or ``Failed``), one that takes longer shows ``Loading`` from then
on. The spread is there because a fleet's replicas start holding within the same second (the
target moves for all of them at once): without it, 1,000 slow loads sent their ``Loading``
writes in one second, and most of them failed under that burst and were read back and
retried (bench/propagation/one-region-1000/analysis.md). Anything else — a snapshot
dropped, a failure, a retry's reason, a gate that changes, another writer's edit — is
written at once. The operator
counts a replica that does not serve a snapshot as Loading whatever its annotations say,
so nothing it decides waits on that write.

Loading and serving never wait on the API server: :meth:`PodWriter.publish` only records
what is wanted. A failed write is retried after a jittered back-off and the Pod read back
first (the write's outcome is unknown) — except after a ``429``: the API server's priority
and fairness refused the request unprocessed, so the writer waits at least a second and
writes again without a read (at 1,000 replicas each refusal's read-back was one more
request to a saturated server: ~1,900 GETs per rollout).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from hotload.api import ReplicaState
from hotload.api.conditions import parse_time
from hotload.api.pod import (
    ANNOTATION_SINCE,
    ANNOTATION_STATE,
    ANNOTATION_TARGET,
    CONDITION_SNAPSHOT_READY,
    SIDECAR_ANNOTATIONS,
)
from hotload.errors import HotloadError, KubeError, KubeNotFound
from hotload.kube import kube_errors
from hotload.kube.raw import read_json
from hotload.kube.reflector import Reflector
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
#: After the Pod was found gone: how long until it is looked for again.
DEFAULT_CHECK_INTERVAL_S = 10.0
#: A load shorter than this reports only the state it ends in (one write per delta); a
#: longer one shows ``Loading`` from this point on. Half a minute: a delta on a GPU replica
#: loads in seconds and a Full of a large model in minutes, so a delta writes once even
#: while a thousand replicas load it on a busy control plane (at 10 s, most of a 1,000-
#: replica region on two cores wrote twice: bench/propagation/one-region-1000), and a slow
#: Full or a stuck load still shows within 30-45 s. No decision waits on this write: the
#: operator counts a replica that does not serve the target as Loading anyway.
DEFAULT_LOADING_REPORT_AFTER_S = 30.0
#: The API server's priority-and-fairness refusal (nothing was processed).
TOO_MANY_REQUESTS = 429
#: After a 429, wait at least this (stretched by a random 1-2x), as the API server's
#: ``Retry-After: 1`` asks, instead of the short first steps of the backoff.
THROTTLED_WAIT_S = 1.0
#: A hold lasts between ``loading_report_after_s`` and this much more of it, drawn per hold.
HOLD_SPREAD = 0.5
#: The annotations a "working on a newer target" report may change without a prompt write.
_WORK_KEYS = frozenset({ANNOTATION_TARGET, ANNOTATION_STATE, ANNOTATION_SINCE})


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
    resource_version: str | None = None


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
    version = metadata.get("resourceVersion")
    return ObservedPod(annotations, status, reason, message, transition, uid, version)


def older(version: str | None, than: str | None) -> bool:
    """True when ``version`` is known to precede ``than`` (a watch event that lags the
    answer of our own later patch). Resource versions are etcd revisions, integers; where
    either is not, nothing is assumed (the Pod is taken as seen)."""
    if not version or not than or not (version.isdigit() and than.isdigit()):
        return False
    return int(version) < int(than)


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


def working_on_only(
    wanted: PodAnnotations, gate: ReadinessGate | None, observed: ObservedPod
) -> bool:
    """True when the report differs from the Pod only in that the replica works on a
    newer target: ``Loading``, serving what the Pod already says it serves (no reason
    given), the gate unchanged, and the Pod saying ``Ready`` or ``Loading`` (or nothing
    yet). Such a write may wait (see the module doc); every other difference may not."""
    if wanted.state is not ReplicaState.LOADING:
        return False
    if gate is not None and gate_differs(gate, observed):
        return False
    if observed.annotations.get(ANNOTATION_STATE) not in (None, "Ready", "Loading"):
        return False
    return all(
        observed.annotations.get(key) == value
        for key, value in wanted.values().items()
        if key not in _WORK_KEYS
    )


def since_of(observed: ObservedPod | None) -> datetime | None:
    """The ``since`` the Pod carried when read (None: none, or not a time)."""
    since = observed.annotations.get(ANNOTATION_SINCE) if observed is not None else None
    return parse_time(since) if since else None


def hold_for(loading_report_after_s: float, rng: random.Random) -> float:
    """One hold's length: ``loading_report_after_s`` stretched by up to :data:`HOLD_SPREAD`
    of itself, uniformly, so a fleet's holds that started together end spread out."""
    return loading_report_after_s * (1.0 + HOLD_SPREAD * rng.random())


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
        loading_report_after_s: float = DEFAULT_LOADING_REPORT_AFTER_S,
    ) -> None:
        # Any: the calls pass the client's private _preload_content option.
        self._core: Any = CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._backoff = Backoff(retry)
        self.check_interval_s = check_interval_s
        self.loading_report_after_s = loading_report_after_s
        self._held_since: float | None = None
        """Monotonic time since when a "working on a newer target" write is held back."""
        self._held_for = loading_report_after_s
        """How long the present hold lasts (drawn when it starts: :func:`hold_for`)."""
        self._hold_stopped_at: float | None = None
        """Monotonic time since when the hold's clock stands still (:meth:`hold_stopped`)."""
        self._wanted_annotations: PodAnnotations | None = None
        self._wanted_gate: ReadinessGate | None = None
        self._observed: ObservedPod | None = None
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._rng = random.Random()
        self.patches = 0
        """Patches sent (one per report): for tests and the scale benchmark."""
        self.repairs = 0
        """Patches that repaired a difference someone else made (not our own transition)."""
        self.reads = 0
        """GETs of the Pod (at start and after a failed write that was not a 429; the watch
        does the rest)."""
        self._gone = False
        self.watch = Reflector(
            lambda: api,
            f"/api/v1/namespaces/{namespace}/pods",
            None,
            self._event,
            params=[("fieldSelector", f"metadata.name={name}")],
            retry=retry,
            list_first=False,
            context=self._context(),
            what="own pod watch",
        )

    def _context(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "pod": self.name}

    @property
    def observed(self) -> ObservedPod | None:
        return self._observed

    async def observe_at_start(self, delay: Callable[[int], float]) -> ObservedPod | None:
        """Read the Pod once (a restarted sidecar picks up its report); retried after
        ``delay(attempt)`` while transient, given up (None) when the API refuses for good."""
        attempt = 0
        while True:
            try:
                return await self.observe()
            except HotloadError as err:
                if not err.transient:
                    log.error("cannot read own pod", extra={**self._context(), "error": str(err)})
                    return None
                await asyncio.sleep(delay(attempt))
                attempt += 1

    async def observe(self) -> ObservedPod:
        """Read the Pod (a restarted sidecar resumes its report from it)."""
        with kube_errors(**self._context()):
            pod = await read_json(
                self._core.read_namespaced_pod(self.name, self.namespace, _preload_content=False)
            )
        self.reads += 1
        self._observed = _observed(pod)
        self._gone = False
        return self._observed

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._gone = True
        else:
            self._seen(pod)

    def _seen(self, pod: dict[str, Any]) -> None:
        """The watch saw the Pod: a change of ours someone undid is repaired at once."""
        seen = _observed(pod)
        have = self._observed
        if have is not None and older(seen.resource_version, have.resource_version):
            return  # our own later patch's answer already told us more
        self._observed = seen
        self._gone = False
        if self._differs(seen):
            self._changed.set()  # a repair (``settled`` waits for our own reports only)

    def publish(self, annotations: PodAnnotations, gate: ReadinessGate) -> None:
        """Ask for this report to be on the Pod (soon, in the background).

        The agent publishes on every pass (every 5 s, and on each wake), mostly the report
        it published last: that one was compared with the Pod then, and since then every
        change of the Pod went through :meth:`_seen` and every failed write is retried by
        the loop, so it is not compared again (at 1,000 agents the comparisons were ~2 % of
        a shared host's CPU)."""
        if annotations == self._wanted_annotations and gate == self._wanted_gate:
            return
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
        """When to look again for a Pod found gone (jittered)."""
        return self.check_interval_s * self._rng.uniform(0.8, 1.2)

    async def run(self) -> None:
        """Keep the Pod saying what is wanted, until cancelled (the watch beside it)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.watch.run(), name="own-pod-watch")
            await self._write_loop()

    async def _write_loop(self) -> None:
        read_back = self._observed is None
        held = 0.0
        while True:
            if not read_back:
                try:
                    async with asyncio.timeout(held if held > 0 else None):
                        await self._changed.wait()
                except TimeoutError:
                    pass  # a held write's time came
            self._changed.clear()
            try:
                if read_back:
                    await self.observe()
                    read_back = False
                own_change = self._idle.is_set() is False
                held = self._hold_left()
                if held > 0:
                    continue  # a quick load reports only the state it ends in
                if self._gone:
                    raise KubeNotFound("own pod deleted", **self._context())
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
                throttled = err.status == TOO_MANY_REQUESTS
                delay = self._backoff.next_delay()
                if throttled:
                    delay = max(delay, THROTTLED_WAIT_S * self._rng.uniform(1.0, 2.0))
                log.warning(
                    "writing the pod report failed, retrying",
                    extra={**self._context(), "error": str(err), "retry_in_s": round(delay, 2)},
                )
                await asyncio.sleep(delay)
                # A refused request was not processed: the Pod is as last seen, and reading
                # it back would be one more request to an API server that said it has none.
                read_back = read_back or not throttled
                self._changed.set()  # write again at once, read or not

    def _hold_left(self) -> float:
        """Seconds a "working on a newer target" write may still wait (0: write now)."""
        observed, wanted = self._observed, self._wanted_annotations
        if (
            observed is None
            or wanted is None
            or not working_on_only(wanted, self._wanted_gate, observed)
            or not annotations_differ(wanted, observed)
        ):
            self._held_since = None
            return 0.0
        stopped = self._hold_stopped_at
        now = stopped if stopped is not None else time.monotonic()
        if self._held_since is None:
            self._held_since = now
            self._held_for = hold_for(self.loading_report_after_s, self._rng)
        return self._held_since + self._held_for - now

    @contextmanager
    def hold_stopped(self) -> Iterator[None]:
        """The hold's clock stands still inside: a load's wait for its turn to build in a
        shared host is not part of the load.

        A sidecar in a pod of its own starts building at once. In the local runtime's
        shared mode a thousand agents take turns on two cores
        (:mod:`hotload.sidecar.build_slots`), and the last ones wait most of a rollout for
        theirs: counted as loading, their quick deltas outlasted the hold and wrote
        ``Loading`` then ``Ready`` — writes a fleet of real pods would not make, which then
        slowed the API server the turns share. The hold resumes where it stood when the
        turn comes; what is not held (a failure, a dropped snapshot) still goes at once.
        """
        self._hold_stopped_at = time.monotonic()
        try:
            yield
        finally:
            stopped_at, self._hold_stopped_at = self._hold_stopped_at, None
            if self._held_since is not None:
                self._held_since += time.monotonic() - max(stopped_at, self._held_since)

    async def _write(self, *, repair: bool) -> None:
        """One patch of ``pods/status`` with every part of the report that differs."""
        observed = self._observed
        assert observed is not None  # read just before
        annotations, gate = self._wanted_annotations, self._wanted_gate
        body: dict[str, Any] = {}
        if annotations is not None and annotations_differ(annotations, observed):
            body.update(annotation_patch(annotations))
        what = "annotations"
        call: dict[str, Any] = {"_content_type": MERGE_PATCH}
        if gate is not None and gate_differs(gate, observed):
            moment = observed.gate_transition
            if observed.gate_status != gate.ready or moment is None:
                moment = datetime.now(UTC)
            body.update(condition_patch(gate, moment))
            what = "condition" if len(body) == 1 else "annotations and condition"
            call = {}  # strategic merge: conditions merge by type
        with kube_errors(**self._context(), write=what):
            pod = await read_json(
                self._core.patch_namespaced_pod_status(
                    self.name, self.namespace, body, _preload_content=False, **call
                )
            )
        self._observed = _observed(pod)
        self._count(repair, what)

    def _count(self, repair: bool, what: str) -> None:
        self.patches += 1
        if repair:
            self.repairs += 1
            log.info(
                "pod report repaired (another writer changed it)",
                extra={**self._context(), "what": what},
            )
