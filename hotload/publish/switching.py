"""The publisher's side of the coordinated switch (docs/operator.md, "Coordinated switch").

The publisher is the one actor that sees every region, so it decides. For each snapshot of
a deployment whose regions say ``spec.rollout.switch: Coordinated``:

1. it stamps the PolicySnapshot with the deadline ``hotload.dev/switch-by`` (publish time +
   ``stagingTimeoutSeconds`` + the lead; the same instant in every region) before applying
   it anywhere;
2. while the snapshot is delivered, it reads each coordinated region's PolicySnapshot until
   every desired replica there is Staged (``status.stagedReplicas``) or the staging timeout
   passed;
3. it decides once — a switch time ``now + lead`` (never past the deadline) when everyone is
   Staged or ``onStagingTimeout`` is Follow, else an abort — and writes it as
   ``hotload.dev/switch-at`` (or ``hotload.dev/switch-aborted``) on each region's snapshot,
   written once (:meth:`RegionClient.decide_once`); a decision already on a snapshot (a
   publisher that restarted) is adopted, never overwritten;
4. a region that does not answer gets the decision queued in the work directory's state
   (and in the snapshot still queued for it), written with the next publish or ``flush``.

Every region presumes the same rule at the deadline when no decision reaches it (the
operator's ``operator/switch.py``), so a publisher that dies between staging and commit
leaves no replica waiting, and none switching alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from hotload.api.labels import (
    SWITCH_ABORTED_ANNOTATION,
    SWITCH_AT_ANNOTATION,
    SWITCH_BY_ANNOTATION,
)
from hotload.api.rollout_deployment import RolloutSpec
from hotload.api.switch import (
    StagingTimeoutAction,
    SwitchDecision,
    SwitchMode,
    switch_time,
)
from hotload.errors import HotloadError, KubeNotFound
from hotload.publish.region_client import RegionClient, SnapshotState
from hotload.publish.results import SwitchResult
from hotload.publish.state import PendingSwitch, PublisherState

log = logging.getLogger(__name__)

POLL_S: Final = 0.2
"""How often the regions' staging is read while the publisher waits on it."""
SETTLE_TRIES: Final = 10
"""A snapshot not found where it was just being applied is looked for this many times."""


@dataclass(frozen=True)
class FleetSwitch:
    """How the coordinated regions switch (their ``spec.rollout``, taken together)."""

    contexts: tuple[str, ...]
    """The regions whose deployment is Coordinated."""
    timeout_s: float
    lead_s: float
    abort: bool
    """``onStagingTimeout: Abort`` (in any region: the strictest wins)."""


def fleet_switch(
    rollouts: Mapping[str, RolloutSpec], silent: Iterable[str] = ()
) -> FleetSwitch | None:
    """The fleet's switch from each region's ``spec.rollout``; None when none coordinates.

    ``silent``: regions that did not answer. Where another region coordinates they count
    among the coordinated ones (``spec.rollout`` is the same everywhere): not Staged until
    they answer, so the decision waits for the staging timeout — the rule they presume at
    the deadline — and is queued for them. Left out, they would be committed without (the
    others switching at once while they presume the deadline; with Abort, aborting alone
    while the others switched) and never be handed the decision.

    Keep ``spec.rollout`` the same in every region: each region's operator presumes its own
    ``onStagingTimeout`` at the deadline. Where they differ the publisher takes the longest
    timeout and lead and Abort over Follow, and says so."""
    coordinated = {
        context: rollout
        for context, rollout in rollouts.items()
        if rollout.switch is SwitchMode.COORDINATED
    }
    if not coordinated:
        return None
    settings = {
        (r.staging_timeout_seconds, r.lead_milliseconds, r.on_staging_timeout)
        for r in coordinated.values()
    }
    if len(settings) > 1:
        log.warning(
            "regions disagree on spec.rollout: using the longest timeout and lead, and Abort "
            "if any region says Abort; keep it the same in every region",
            extra={"regions": {c: r.model_dump(mode="json") for c, r in coordinated.items()}},
        )
    return FleetSwitch(
        contexts=tuple(sorted({*coordinated, *silent})),
        timeout_s=max(r.staging_timeout_seconds for r in coordinated.values()),
        lead_s=max(r.lead_milliseconds for r in coordinated.values()) / 1000,
        abort=any(r.on_staging_timeout is StagingTimeoutAction.ABORT for r in coordinated.values()),
    )


@dataclass(frozen=True)
class Decision:
    """What the publisher writes on every region's snapshot."""

    annotation: str
    value: str
    all_staged: bool

    @property
    def committed(self) -> bool:
        return self.annotation == SWITCH_AT_ANNOTATION


def _staged(look: SnapshotState) -> bool:
    return (
        look.exists
        and look.desired_replicas is not None
        and look.staged_replicas is not None
        and look.staged_replicas >= look.desired_replicas
    )


def decide(
    looks: Mapping[str, SnapshotState], fleet: FleetSwitch, now: datetime, deadline: datetime
) -> Decision | None:
    """The decision at ``now`` from each coordinated region's look; None: keep waiting.

    A decision already written anywhere is adopted (a commit over an abort); everyone
    Staged commits ``now + lead``; at the staging timeout (the deadline less the lead) the
    fleet commits at the deadline (Follow) or aborts (Abort) — exactly what every region
    presumes if this decision never reaches it."""
    written = [look.decided for look in looks.values() if look.decided is not None]
    everyone = all(_staged(look) for look in looks.values())
    for annotation in (SWITCH_AT_ANNOTATION, SWITCH_ABORTED_ANNOTATION):
        for key, value in written:
            if key == annotation:
                return Decision(key, value, everyone)
    lead = timedelta(seconds=fleet.lead_s)
    if everyone:
        return Decision(SWITCH_AT_ANNOTATION, switch_time(min(now + lead, deadline)), True)
    if now + lead < deadline:
        return None
    if fleet.abort:
        return Decision(SWITCH_ABORTED_ANNOTATION, switch_time(now), False)
    return Decision(SWITCH_AT_ANNOTATION, switch_time(deadline), False)


def _count(look: SnapshotState) -> str:
    if not look.exists or look.desired_replicas is None:
        return "?"
    return f"{look.staged_replicas or 0}/{look.desired_replicas}"


class SwitchCoordinator:
    """Stamps, watches and decides the coordinated switch of each snapshot."""

    def __init__(
        self,
        clients: Mapping[str, RegionClient],
        state: PublisherState,
        *,
        poll_s: float = POLL_S,
    ) -> None:
        self._clients = clients
        self._state = state
        self._poll_s = poll_s

    async def fleet(self) -> FleetSwitch | None:
        """The coordinated regions' settings now (a region that does not answer counts as
        coordinated and not Staged while another region coordinates: :func:`fleet_switch`)."""

        async def rollout(client: RegionClient) -> tuple[str, RolloutSpec | None, bool]:
            try:
                return client.context, await asyncio.to_thread(client.rollout), True
            except KubeNotFound:
                return client.context, None, True  # no deployment there: not in the fleet
            except HotloadError as err:
                where = {"context": client.context, "error": str(err)}
                log.info("region's rollout settings unknown", extra=where)
                return client.context, None, False

        found = await asyncio.gather(*(rollout(c) for c in self._clients.values()))
        return fleet_switch(
            {context: spec for context, spec, _ in found if spec is not None},
            silent=[context for context, _, answered in found if not answered],
        )

    @staticmethod
    def stamp(policy: dict[str, Any], fleet: FleetSwitch, now: datetime) -> datetime:
        """Put the deadline on the PolicySnapshot every region gets; returns it."""
        deadline = now + timedelta(seconds=fleet.timeout_s + fleet.lead_s)
        metadata = policy.setdefault("metadata", {})
        annotations = metadata.setdefault("annotations", {})
        annotations[SWITCH_BY_ANNOTATION] = switch_time(deadline)
        return deadline

    async def coordinate(
        self, identity: str, fleet: FleetSwitch, deadline: datetime, started: float
    ) -> SwitchResult:
        """Wait for every replica to be Staged (or the timeout), decide, write everywhere."""
        staged_at: float | None = None
        while True:
            looks = await self._look(identity, fleet.contexts)
            if staged_at is None and all(_staged(look) for look in looks.values()):
                staged_at = time.monotonic()
            decision = decide(looks, fleet, datetime.now(UTC), deadline)
            if decision is not None:
                break
            await asyncio.sleep(self._poll_s)
        log.info(
            "coordinated switch decided",
            extra={"snapshot": identity, "decision": decision.annotation,
                   "value": decision.value, "all_staged": decision.all_staged,
                   "staged": {c: _count(look) for c, look in looks.items()}},
        )  # fmt: skip
        outcomes = await asyncio.gather(
            *(self._write(context, identity, decision) for context in fleet.contexts)
        )
        undelivered = sorted(c for c, ok in zip(fleet.contexts, outcomes, strict=True) if not ok)
        return SwitchResult(
            decision=SwitchDecision.COMMITTED if decision.committed else SwitchDecision.ABORTED,
            at=decision.value if decision.committed else None,
            deadline=switch_time(deadline),
            all_staged=decision.all_staged,
            staged_seconds=round(staged_at - started, 3) if staged_at is not None else None,
            staged={context: _count(look) for context, look in looks.items()},
            undelivered=undelivered,
        )

    async def _look(self, identity: str, contexts: tuple[str, ...]) -> dict[str, SnapshotState]:
        async def look(context: str) -> SnapshotState:
            try:
                return await asyncio.to_thread(self._clients[context].snapshot_state, identity)
            except HotloadError:
                return SnapshotState(exists=False)  # not answering: not Staged

        found = await asyncio.gather(*(look(c) for c in contexts))
        return dict(zip(contexts, found, strict=True))

    async def _write(self, context: str, identity: str, decision: Decision) -> bool:
        """Write the decision in one region; False when it is queued there instead."""
        client = self._clients[context]
        for _ in range(SETTLE_TRIES):
            try:
                held = await asyncio.to_thread(
                    client.decide_once, identity, decision.annotation, decision.value
                )
            except KubeNotFound:
                if self._queue_in_pending(context, identity, decision):
                    break  # applied later with the decision on it (and checked then)
                await asyncio.sleep(self._poll_s)  # being applied right now: look again
                continue
            except HotloadError as err:
                log.warning(
                    "region did not take the switch decision: queued",
                    extra={"context": context, "snapshot": identity, "error": str(err)},
                )
                self._queue_in_pending(context, identity, decision)
                break
            if held != (decision.annotation, decision.value):
                log.warning(
                    "region holds another switch decision (written before): it stands",
                    extra={"context": context, "snapshot": identity, "held": held},
                )
            return True
        queue = self._state.switches.setdefault(context, [])
        if not any(item.identity == identity for item in queue):
            queue.append(PendingSwitch(identity=identity, annotation=decision.annotation,
                                       value=decision.value))  # fmt: skip
        return False

    def _queue_in_pending(self, context: str, identity: str, decision: Decision) -> bool:
        """Put the decision on the snapshot still queued for ``context``; False if none is."""
        for item in self._state.pending.get(context, []):
            if item.identity == identity:
                metadata = item.policy_snapshot.setdefault("metadata", {})
                assert isinstance(metadata, dict)
                metadata.setdefault("annotations", {})[decision.annotation] = decision.value
                return True
        return False

    async def retry(self) -> None:
        """Write the decisions still queued for regions that did not answer before."""
        for context, queue in self._state.switches.items():
            client = self._clients.get(context)
            while queue and client is not None:
                item = queue[0]
                try:
                    await asyncio.to_thread(
                        client.decide_once, item.identity, item.annotation, item.value
                    )
                except KubeNotFound:
                    if any(
                        p.identity == item.identity for p in self._state.pending.get(context, [])
                    ):
                        break  # still queued itself: it carries the decision
                except HotloadError as err:
                    where = {"context": context, "snapshot": item.identity, "error": str(err)}
                    log.info("switch decision still queued", extra=where)
                    break
                queue.pop(0)
