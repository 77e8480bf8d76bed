"""The region's leader election: one ``coordination.k8s.io/v1`` Lease, held by one operator.

Every operator replica runs one :class:`LeaderLease`. The holder renews the Lease every
``renew_s`` with a write conditioned on the resourceVersion it holds; a candidate reads it
every ``poll_s`` and takes it (a write conditioned on the version it read, so two
candidates never both win) once it has seen no renewal for ``duration_s`` by its *own*
clock, or at once when the Lease names nobody (a leader that stopped cleanly releases it).

- **Fencing.** The holder's tenure is :class:`~hotload.operator.fencing.Fence` (its identity
  and the Lease's ``leaseTransitions`` when it took it). It counts as held only until
  ``duration_s - renew_s`` after the *start* of its last successful renewal: a candidate
  counts ``duration_s`` from a moment after that start, so the two never overlap in time.
  A holder frozen (SIGSTOP) and resumed finds its tenure ended by its own clock before it
  writes; a write already past that check is refused by the apiserver, whose admission
  policy compares the token the write carries with the Lease (see ``fencing.py``).
- **A restarted leader yields.** The identity is the pod's name plus a random incarnation,
  so a restarted process is a new candidate, not the old holder: it must wait a whole
  ``duration_s`` of silence from its first look, and the standby, which has been watching
  all along, reaches that moment first.
- **A warm standby wins a released Lease.** A candidate that has watched the Lease for a
  whole ``duration_s`` takes a Lease that names nobody at once; a newcomer (watching for
  less) takes it only :attr:`LeaseTiming.newcomer_wait_s` after it saw it released. The
  standby, which reads it every ``poll_s`` with its caches already filled, takes it first.
  (The replica that replaces a deleted leader starts while the old one shuts down; it won
  that race by tenths of a second and led with cold caches while the standby idled.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient, CoordinationV1Api

from hotload.errors import KubeConflict, KubeError, KubeNotFound, NotLeader
from hotload.kube import kube_errors
from hotload.kube.raw import read_json
from hotload.operator.fencing import Fence

log = logging.getLogger(__name__)

LEASE_API_VERSION: Final = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseTiming:
    duration_s: float = 10.0
    """Silence after which a candidate takes the Lease (``spec.leaseDurationSeconds``)."""
    renew_s: float = 2.0
    """How often the holder renews; also its safety margin (it stops ``renew_s`` early)."""
    poll_s: float = 1.0
    """How often a candidate reads the Lease."""

    def __post_init__(self) -> None:
        if not 0 < self.renew_s < self.duration_s / 2:
            raise ValueError("renew_s must be positive and under half of duration_s")

    @property
    def newcomer_wait_s(self) -> float:
        """How long a newcomer waits after it saw the Lease released before taking it: two
        of a standby's polls, so a standby that has been polling all along takes it first."""
        return 2 * self.poll_s


def incarnation_identity(pod_name: str) -> str:
    """This process's holder identity: the pod's name and a random incarnation, so a
    restarted container (same pod, same name) never resumes its predecessor's tenure."""
    return f"{pod_name}_{secrets.token_hex(4)}"


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderLease:
    """Acquire, renew and release one Lease; :meth:`fence` says whether we hold it now."""

    def __init__(
        self,
        api: Callable[[], ApiClient],
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self._on_change = on_change
        self._fence: Fence | None = None
        self._valid_until = float("-inf")
        self._body: dict[str, Any] | None = None
        """The Lease as we last wrote it (a renewal is conditioned on its version)."""
        self._seen_version = ""
        self._seen_at = float("-inf")
        """Our clock when the Lease's version last changed (a candidate's expiry counts
        from here)."""
        self._first_look: float | None = None
        """Our clock when this process first read the Lease: a newcomer until ``duration_s``
        after it."""
        self._tenure = 0
        self._leading = asyncio.Event()
        self._poke = asyncio.Event()
        self.transitions_seen = 0

    # --- what the reconcilers ask -------------------------------------------------------

    @property
    def tenure(self) -> int:
        return self._tenure

    @property
    def leading(self) -> bool:
        return self._fence is not None and self._now() < self._valid_until

    async def wait_leading(self) -> int:
        while not self.leading:
            self._leading.clear()
            await self._leading.wait()
        return self._tenure

    def fence(self) -> Fence | None:
        fence = self._fence
        if fence is None or self._now() >= self._valid_until:
            if fence is not None:
                self._drop("the tenure ran out before it was renewed")
            raise NotLeader(
                "this operator does not hold the leader Lease", lease=self.name,
                identity=self.identity,
            )  # fmt: skip
        return fence

    def suspect(self) -> None:
        """The apiserver refused a fenced write: check the Lease at once."""
        self._valid_until = min(self._valid_until, self._now())
        self._poke.set()

    # --- the loop ----------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _coordination(self) -> Any:
        return CoordinationV1Api(self._api())

    def _context(self, **extra: Any) -> dict[str, Any]:
        return {"lease": f"{self.namespace}/{self.name}", "identity": self.identity, **extra}

    async def run(self) -> None:
        """Hold the Lease while this process lives (cancel to stop; then :meth:`release`)."""
        while True:
            try:
                if self._fence is not None:
                    await self._renew()
                else:
                    await self._try_acquire()
            except KubeError as err:
                log.warning("leader Lease call failed", extra=self._context(error=str(err)))
            except Exception:
                # The election outlives any one bad answer: a loop that ended here would
                # leave a live, healthy-looking process that never leads again (a standby
                # that never takes over). A tenure still lapses below, by its own clock.
                log.exception("leader Lease round failed", extra=self._context())
            if self._fence is not None and self._now() >= self._valid_until:
                self._drop("the Lease could not be renewed in time")
            pause = self.timing.renew_s if self._fence is not None else self.timing.poll_s
            self._poke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), pause)

    async def _get(self) -> dict[str, Any] | None:
        try:
            with kube_errors(**self._context()):
                return await read_json(
                    self._coordination().read_namespaced_lease(
                        self.name, self.namespace, _preload_content=False
                    )
                )
        except KubeNotFound:
            return None

    async def _write(self, body: dict[str, Any], *, create: bool) -> dict[str, Any]:
        with kube_errors(**self._context()):
            api = self._coordination()
            if create:
                call = api.create_namespaced_lease(self.namespace, body, _preload_content=False)
            else:
                call = api.replace_namespaced_lease(
                    self.name, self.namespace, body, _preload_content=False
                )
            return await read_json(call)

    def _spec(self, transitions: int, acquired: datetime, now: datetime) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.duration_s)),
            "acquireTime": _micro_time(acquired),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    async def _try_acquire(self) -> None:
        lease = await self._get()
        now = self._now()
        stamp = datetime.now(UTC)
        if lease is None:
            body = {
                "apiVersion": LEASE_API_VERSION,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0, stamp, stamp),
            }
            try:
                written = await self._write(body, create=True)
            except KubeConflict:
                return  # another candidate created it first
            self._take(written, now, previous=None)
            return
        if self._first_look is None:
            self._first_look = now
        metadata = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        version = str(metadata.get("resourceVersion") or "")
        if version != self._seen_version:
            self._seen_version, self._seen_at = version, now
        holder = spec.get("holderIdentity") or ""
        ours = holder == self.identity  # a tenure of ours that ran out: take a new epoch
        if holder and not ours and now - self._seen_at < self.timing.duration_s:
            return  # held, and renewed within the duration as far as we have seen
        newcomer = now - self._first_look < self.timing.duration_s
        if not holder and newcomer and now - self._seen_at < self.timing.newcomer_wait_s:
            return  # released: a standby that has been watching takes it first
        transitions = int(spec.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**spec, **self._spec(transitions, stamp, stamp)}
        try:
            written = await self._write(lease, create=False)
        except (KubeConflict, KubeNotFound):
            return  # another candidate took it, or it was deleted: look again
        self._take(written, now, previous=holder or None)

    def _take(self, written: dict[str, Any], sent_at: float, previous: str | None) -> None:
        spec = written.get("spec") or {}
        self._fence = Fence(self.identity, int(spec.get("leaseTransitions") or 0))
        self._body = written
        self._valid_until = sent_at + self.timing.duration_s - self.timing.renew_s
        self._tenure += 1
        self._leading.set()
        log.info(
            "took the leader Lease: deciding from here",
            extra={**self._context(), "previous": previous, "epoch": self._fence.epoch},
        )
        if self._on_change is not None:
            self._on_change(True)

    async def _renew(self) -> None:
        """One renewal: the Lease as we last wrote it, conditioned on that version."""
        fence, body = self._fence, self._body
        if fence is None or body is None:
            return
        sent_at = self._now()
        renewed = {**body, "spec": {**(body.get("spec") or {}),
                                    "renewTime": _micro_time(datetime.now(UTC))}}  # fmt: skip
        try:
            written = await self._write(renewed, create=False)
        except (KubeConflict, KubeNotFound):
            # Changed under us: ours still (someone edited its labels), or taken over.
            lease = await self._get()
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                self._drop("another holder took the Lease" if lease else "the Lease was deleted")
            else:
                self._body = lease  # renewed on the next round
            return
        if self._fence is fence:
            self._body = written
            self._valid_until = sent_at + self.timing.duration_s - self.timing.renew_s
            # A renewal sent after the last one's validity ran out (this process's loop
            # was busy past it) makes a tenure current again that a waiter saw lapse:
            # wake it, or it waits on a Lease we keep renewing.
            self._leading.set()

    def _drop(self, why: str) -> None:
        if self._fence is None:
            return
        log.warning("leader Lease lost: no more decisions from here", extra=self._context(why=why))
        self._fence, self._body = None, None
        self._valid_until = float("-inf")
        self._seen_version, self._seen_at = "", float("-inf")
        self._leading.clear()
        if self._on_change is not None:
            self._on_change(False)

    async def release(self) -> None:
        """Hand the Lease back at a clean stop, so a standby takes over at once."""
        fence, body = self._fence, self._body
        self._fence, self._body = None, None
        self._valid_until = float("-inf")
        if fence is None or body is None:
            return
        released = {**body, "spec": {**(body.get("spec") or {}), "holderIdentity": None,
                                     "leaseDurationSeconds": 1}}  # fmt: skip
        try:
            await self._write(released, create=False)
            log.info("released the leader Lease", extra=self._context())
        except KubeError as err:  # taken meanwhile, or the apiserver is away: it expires
            log.warning("could not release the leader Lease", extra=self._context(error=str(err)))
