"""One region's part of one publish: catch up on what it missed, upload, apply, wait.

Each region runs its own ``RegionRun`` concurrently with the others; whatever happens in
one (its apiserver down, its bucket refusing writes) ends as that region's result and
never reaches another. Snapshots reach a region in publish order: while older ones are
pending there, a new one queues behind them and goes out with them once the region
answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hotload.api import PolicySnapshot
from hotload.api import reasons as api_reasons
from hotload.api.switch import SwitchDecision
from hotload.errors import HotloadError, PublishConflict
from hotload.publish.observer import Phase, PublishObserver
from hotload.publish.region_client import RegionBucket, RegionClient, SnapshotState
from hotload.publish.results import RegionOutcome, RegionResult
from hotload.publish.state import PendingSnapshot
from hotload.snapshot.publish import UploadReport
from hotload.waiting import wait_until_async

log = logging.getLogger(__name__)

POLL_S = 0.5

Upload = Callable[[PendingSnapshot, Phase], Awaitable[UploadReport | None]]
"""Put a snapshot into the bucket this region reads (None when another region's upload to
the same bucket did it). Raises a HotloadError on failure."""
Landed = Callable[[PendingSnapshot], Awaitable[bool]]
"""Wait until replication brought a snapshot's files to this region's bucket; False when
they did not land in time (the snapshot is applied anyway: its replicas retry)."""


@dataclass(frozen=True)
class WaitSettings:
    enabled: bool
    timeout_s: float
    unreachable_after_s: float
    """A region whose apiserver stops answering for this long during a wait is left."""


@dataclass
class RegionRun:
    client: RegionClient
    bucket: RegionBucket | None
    pending: list[PendingSnapshot]
    """This region's queue, oldest first (mutated in place: it is the publisher's state)."""
    upload: Upload
    observer: PublishObserver
    started: float
    """``time.monotonic()`` when the publish was called."""
    wait: WaitSettings
    landed: Landed | None = None
    """Set where the bucket is a replica of the home bucket."""
    delivered: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    reports: dict[str, UploadReport] = field(default_factory=dict)

    @property
    def context(self) -> str:
        return self.client.context

    async def drain(self, current: str | None = None) -> str | None:
        """Deliver the queue in order; the error that stopped it (None: all delivered)."""
        if self.pending and self.bucket is None:
            return "the region's RolloutDeployment could not be read"
        while self.pending:
            head = self.pending[0]
            catching_up = head.identity != current
            try:
                if not head.uploaded:
                    phase = Phase.CATCHING_UP if catching_up else Phase.UPLOADING
                    report = await self.upload(head, phase)
                    if report is not None:
                        self.reports[head.identity] = report
                    head.uploaded = True
                if self.landed is not None:
                    self.observer.region_progress(self.context, Phase.REPLICATING)
                    await self.landed(head)
                self.observer.region_progress(
                    self.context, Phase.CATCHING_UP if catching_up else Phase.APPLYING
                )
                snapshot = PolicySnapshot.model_validate(head.policy_snapshot)
                await asyncio.to_thread(self.client.apply, snapshot)
            except PublishConflict as err:
                # That identity is taken for good here: this region never gets it.
                log.error(
                    "snapshot refused by region",
                    extra={"context": self.context, "snapshot": head.identity},
                )
                self.refused[head.identity] = str(err)
            except HotloadError as err:
                return str(err)
            else:
                self.delivered.append(head.identity)
            self.pending.pop(0)
        return None

    async def run(self, item: PendingSnapshot) -> RegionResult:
        """Deliver ``item`` after anything older still queued here; wait if asked."""
        self.pending.append(item)
        error = await self.drain(current=item.identity)
        caught_up = [name for name in self.delivered if name != item.identity]
        if error is not None:
            return self._result(RegionOutcome.PENDING, caught_up, error=error)
        if item.identity in self.refused:
            return self._result(RegionOutcome.FAILED, caught_up, error=self.refused[item.identity])
        report = self.reports.get(item.identity)
        base: dict[str, Any] = {
            "uploaded_bytes": report.bytes if report else 0,
            "upload_seconds": round(report.seconds, 3) if report else None,
            "applied_seconds": round(time.monotonic() - self.started, 3),
        }
        if not self.wait.enabled:
            return self._result(RegionOutcome.APPLIED, caught_up, **base)
        return await self._wait(item.identity, caught_up, base)

    async def _wait(
        self, identity: str, caught_up: list[str], base: dict[str, Any]
    ) -> RegionResult:
        """Read the region's PolicySnapshot until it is Ready, its chain breaks, the region
        stops answering for ``unreachable_after_s``, or the wait's timeout passes."""
        silent_since: float | None = None
        last = SnapshotState(exists=True)

        def counts() -> dict[str, Any]:
            return {
                "ready_replicas": last.ready_replicas,
                "desired_replicas": last.desired_replicas,
            }

        async def settled() -> RegionResult | None:
            nonlocal silent_since, last
            now = time.monotonic()
            try:
                last = await asyncio.to_thread(self.client.snapshot_state, identity)
                silent_since = None
            except HotloadError as err:
                silent_since = silent_since or now
                if now - silent_since > self.wait.unreachable_after_s:
                    return self._result(
                        RegionOutcome.TIMED_OUT,
                        caught_up,
                        error=f"the region stopped answering while rolling out: {err}",
                        **base,
                    )
            self.observer.region_progress(
                self.context, Phase.ROLLING, last.ready_replicas, last.desired_replicas
            )
            if last.switch_decision is SwitchDecision.ABORTED:
                error = "its coordinated switch was aborted: no replica switches to it"
                return self._result(
                    RegionOutcome.SWITCH_ABORTED, caught_up, error=error, **base, **counts()
                )
            if last.chain_valid is False:
                error = f"{last.chain_reason}: {last.chain_message}"
                return self._result(
                    RegionOutcome.CHAIN_BROKEN, caught_up, error=error, **base, **counts()
                )
            if last.ready:
                outcome = (
                    RegionOutcome.SUPERSEDED
                    if last.ready_reason == api_reasons.SUPERSEDED
                    else RegionOutcome.READY
                )
                ready_s = round(now - self.started, 3)
                return self._result(outcome, caught_up, ready_seconds=ready_s, **base, **counts())
            return None

        remaining = self.started + self.wait.timeout_s - time.monotonic()
        result = await wait_until_async(settled, max(remaining, 0.0), interval_s=POLL_S)
        if result is not None:
            return result
        error = f"not Ready within {self.wait.timeout_s:.0f} s"
        return self._result(RegionOutcome.TIMED_OUT, caught_up, error=error, **base, **counts())

    def _result(self, outcome: RegionOutcome, caught_up: list[str], **fields: Any) -> RegionResult:
        result = RegionResult.model_validate(
            {
                "context": self.context,
                "outcome": outcome,
                "bucket_url": self.bucket.bucket_url if self.bucket else None,
                "caught_up": caught_up,
                "pending": [item.identity for item in self.pending],
                **fields,
            }
        )
        self.observer.region_done(self.context, result)
        return result
