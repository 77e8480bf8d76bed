"""The one commit point of a sharded publish: the coordinator (rank 0 of the publisher's
group) decides what every rank writes, checks what they wrote, writes the manifest last
and applies the PolicySnapshot in every region.

- ``decide``: every rank's proposal (step, what it holds, the base of its next delta)
  is in; the ranks must agree on the step and the state_dict, and their blocks must
  cover every tensor exactly once (else the round fails, naming the rank or tensor,
  before anything is encoded). Full or Incremental as for one process
  (:class:`~hotload.publish.deciding.KindChooser`), and a Full also when a rank's base is
  not the last committed snapshot (``ranks-disagree``). The regions' buckets are
  resolved here and handed to the ranks, which write their payload files there.
- ``commit``: every rank's report is in (a rank that failed, or fell silent for
  ``rank_timeout_s``, fails the round: no manifest); the parts are gathered
  (:func:`hotload.snapshot.parted.write_parted` checks their coverage once more and
  writes the headers and the manifest into the coordinator's encoded directory), which
  the publisher's delivery uploads — the manifest last — and applies in every region
  (with the coordinated switch where the regions ask for one), as for one process.

The coordinator keeps, beside its state, the non-tensor files of the last snapshot and
its tensor-set digest and names (``weights/<identity>/.snapshot.json``): what the next
delta needs of its previous, since no process holds the previous tensors whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from hotload.api import SnapshotKind
from hotload.errors import HotloadError, RankFailed
from hotload.publish.cadence import Decision, identity_for
from hotload.publish.deciding import KindChooser
from hotload.publish.observer import PublishObserver
from hotload.publish.policy_object import policy_snapshot
from hotload.publish.rank_channel import RankChannel
from hotload.publish.rank_messages import BucketRef, Outcome, Proposal, Report
from hotload.publish.rank_messages import Decision as DecisionMessage
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.results import PublishResult, RegionOutcome, RegionResult, SwitchResult
from hotload.publish.settings import PublisherSettings
from hotload.publish.state import PublisherState, WorkDir
from hotload.publish.tidying import remember, tidy
from hotload.snapshot.digest import tensor_hash
from hotload.snapshot.encoder import copy_changed_others
from hotload.snapshot.layout import scan
from hotload.snapshot.manifest import TensorPart
from hotload.snapshot.parted import Others, TensorMeta, write_parted
from hotload.snapshot.planner import manifest_digest

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

SNAPSHOT_FILE: Final = ".snapshot.json"
"""In the coordinator's weights directory of a snapshot: its tensor-set digest and names."""


@dataclass
class RoundTiming:
    started: float
    blocked_seconds: float = 0.0


Deliver = Callable[
    [str, dict[str, Any], Path, RoundTiming, list[tuple[str, str | None]]],
    Awaitable[tuple[dict[str, RegionResult], SwitchResult | None]],
]
"""The publisher's delivery: identity, PolicySnapshot, encoded directory, timing, the
buckets the ranks wrote → every region's result, and the coordinated switch's."""


def key(seq: int, *parts: object) -> str:
    return "/".join(str(p) for p in (seq, *parts))


class Coordinator:
    """Rank 0's side of every round (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: PublisherSettings,
        workdir: WorkDir,
        state: PublisherState,
        chooser: KindChooser,
        buckets: RegionBuckets,
        deliver: Deliver,
        channel: RankChannel,
        observer: PublishObserver,
    ) -> None:
        self._settings = settings
        self._workdir = workdir
        self._state = state
        self._chooser = chooser
        self._buckets = buckets
        self._deliver = deliver
        self._channel = channel
        self._observer = observer

    def encoded_dir(self, identity: str) -> Path:
        return self._workdir.encoded(identity)

    # --- decide --------------------------------------------------------------------

    async def decide(self, seq: int, step: int, metas: tuple[TensorMeta, ...]) -> DecisionMessage:
        """Read every proposal, decide, and post the decision (errors included)."""
        members = range(self._channel.members)
        try:
            proposals = await self._gather(seq, "propose", step, Proposal)
            decision = await self._decide(step, metas, proposals)
        except RankFailed as err:
            decision = DecisionMessage(error=str(err), failed_rank=err.context.get("rank"))
        except HotloadError as err:
            decision = DecisionMessage(error=str(err), failed_rank=0)
        self._channel.post(key(seq, "decision"), decision.model_dump_json().encode())
        self._channel.drop(key(seq, "propose", m) for m in members)
        if decision.error is not None:  # the round ends here: every rank must hear it
            await self._heard(key(seq, "decision"), step)
        return decision

    async def _decide(
        self, step: int, metas: tuple[TensorMeta, ...], proposals: list[Proposal]
    ) -> DecisionMessage:
        for rank, proposal in enumerate(proposals):
            if proposal.error is not None:
                raise RankFailed(proposal.error, rank=rank, step=step)
            if proposal.step != step:
                raise RankFailed(
                    "the ranks publish different steps", rank=rank, step=step, found=proposal.step
                )
            if proposal.tensors != proposals[0].tensors:
                raise RankFailed(
                    "the ranks hold different state_dicts (names, dtypes or shapes)",
                    rank=rank,
                    step=step,
                )
        check_coverage(metas, proposals, step)
        await self._buckets.resolve()
        decision = await self._chooser.choose(step, full=any(p.full for p in proposals), lora=False)
        last = self._state.last
        if decision.kind is SnapshotKind.INCREMENTAL and not all(
            p.base is not None
            and last is not None
            and p.base.identity == last.identity
            and p.base.layout == p.layout
            for p in proposals
        ):
            decision = Decision(SnapshotKind.FULL, "ranks-disagree", None)
        if (
            decision.previous is not None
            and not (self._workdir.weights(decision.previous) / SNAPSHOT_FILE).is_file()
        ):
            decision = Decision(SnapshotKind.FULL, "first", None)  # not one of ours
        identity = identity_for(self._settings.prefix, step, decision.kind)
        shutil.rmtree(self.encoded_dir(identity), ignore_errors=True)
        self.encoded_dir(identity).mkdir(parents=True)
        return DecisionMessage(
            identity=identity,
            kind=decision.kind,
            previous=decision.previous,
            why=decision.why,
            buckets=self._write_buckets(),
        )

    def _write_buckets(self) -> list[BucketRef]:
        """Every bucket a region's snapshots are written to, once each (known ones)."""
        found: dict[tuple[str, str | None], BucketRef] = {}
        for context in self._settings.contexts:
            try:
                bucket = self._buckets.write_bucket(context)
            except HotloadError:
                continue  # its RolloutDeployment was never read
            found.setdefault(
                bucket.key,
                BucketRef(
                    context=bucket.context,
                    bucket_url=bucket.bucket_url,
                    endpoint=bucket.endpoint,
                    region=bucket.region,
                ),
            )
        return list(found.values())

    # --- commit --------------------------------------------------------------------

    async def commit(
        self,
        seq: int,
        step: int,
        decision: DecisionMessage,
        metas: tuple[TensorMeta, ...],
        timing: RoundTiming,
    ) -> Outcome:
        """Read every report, write the manifest and deliver, and post the outcome."""
        members = range(self._channel.members)
        try:
            reports = await self._gather(seq, "report", step, Report)
            for rank, report in enumerate(reports):
                if report.error is not None:
                    raise RankFailed(report.error, rank=rank, step=step)
            result, fallback = await self._commit(step, decision, metas, reports, timing)
            outcome = Outcome(result=result, fallback=fallback)
        except RankFailed as err:
            outcome = Outcome(error=str(err), failed_rank=err.context.get("rank"))
        except HotloadError as err:
            log.error("sharded publish failed", extra={"step": step, "error": str(err)[:300]})
            outcome = Outcome(error=str(err), failed_rank=0)
        if outcome.error is not None:
            shutil.rmtree(self.encoded_dir(decision.identity), ignore_errors=True)
            tidy(self._workdir, self._state)
        self._channel.post(key(seq, "outcome"), outcome.model_dump_json().encode())
        self._channel.drop([key(seq, "decision"), *(key(seq, "report", m) for m in members)])
        if seq > 0:
            self._channel.drop([key(seq - 1, "outcome")])
        await self._heard(key(seq, "outcome"), step)
        return outcome

    async def _heard(self, name: str, step: int) -> None:
        """Wait until every other rank that is alive read ``name`` (see
        :meth:`RankChannel.wait_acknowledged`)."""
        await asyncio.to_thread(self._channel.wait_acknowledged, name, step=step)

    async def _commit(
        self,
        step: int,
        decision: DecisionMessage,
        metas: tuple[TensorMeta, ...],
        reports: list[Report],
        timing: RoundTiming,
    ) -> tuple[PublishResult, bool]:
        settings = self._settings
        identity, kind = decision.identity, decision.kind
        started = time.monotonic()
        parts: dict[str, list[TensorPart]] = {}
        hashes: dict[str, str] = {}
        for report in reports:
            for name, found in report.parts.items():
                parts.setdefault(name, []).extend(found)
            hashes.update(report.hashes)
        for meta in metas:
            if meta.nbytes == 0:
                hashes[meta.name] = tensor_hash(b"")
        encoded = self.encoded_dir(identity)
        weights = self._weights_dir(identity)
        previous = self._previous(decision)
        before = scan(self._workdir.weights(previous.identity)) if previous else None
        files, referenced = await asyncio.to_thread(
            copy_changed_others,
            before,
            scan(weights),
            encoded,
            list(settings.ignored_config_fields),
        )
        written = await asyncio.to_thread(
            write_parted,
            encoded,
            identity=identity,
            step=step,
            kind=kind,
            metas=list(metas),
            parts=parts,
            hashes=hashes,
            payloads=[r.payload for r in reports if r.payload is not None],
            others=Others(files, referenced),
            previous=previous.identity if previous else None,
            previous_digest=previous.digest if previous else None,
            removed=sorted(set(previous.tensors) - {m.name for m in metas}) if previous else (),
            ignored_config_fields=settings.ignored_config_fields,
        )
        manifest = written.manifest
        _write_snapshot_file(weights, manifest_digest(manifest), [m.name for m in metas])
        self._observer.snapshot_encoded(
            identity, kind, step, written.stored_bytes, written.tensor_bytes
        )
        policy = policy_snapshot(settings, identity, step, kind, decision.previous, manifest.format)
        buckets = [(b.bucket_url, b.endpoint) for b in decision.buckets]
        regions, switch = await self._deliver(identity, policy, encoded, timing, buckets)
        remember(self._state, identity, step, kind, weights)
        self._chooser.chain_broken = False
        tidy(self._workdir, self._state)
        ranks = [r.rank for r in reports if r.rank is not None]
        result = PublishResult(
            identity=identity,
            step=step,
            kind=kind,
            previous=decision.previous,
            why=decision.why,
            stored_bytes=written.stored_bytes,
            full_bytes=written.tensor_bytes,
            blocked_seconds=round(timing.blocked_seconds, 6),
            encode_seconds=round(max((r.encode_seconds for r in ranks), default=0.0), 3),
            seconds=round(time.monotonic() - timing.started, 3),
            regions=regions,
            switch=switch,
            ranks=ranks,
        )
        log.info(
            "sharded snapshot committed",
            extra={
                "snapshot": identity,
                "ranks": len(reports),
                "commit_s": time.monotonic() - started,
            },
        )
        broken = [c for c, r in regions.items() if r.outcome is RegionOutcome.CHAIN_BROKEN]
        if broken and not settings.fallback_full:
            self._chooser.chain_broken = True
        fallback = bool(broken) and kind is SnapshotKind.INCREMENTAL and settings.fallback_full
        if not fallback:
            self._observer.publish_done(result)
        return result, fallback

    def _weights_dir(self, identity: str) -> Path:
        """The snapshot's non-tensor files (from ``files_from``), kept for the next delta."""
        weights = self._workdir.weights(identity)
        shutil.rmtree(weights, ignore_errors=True)
        weights.mkdir(parents=True)
        source = self._settings.files_from
        if source is not None:
            for relpath in scan(source).others:
                target = weights / relpath
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / relpath, target)
        return weights

    def _previous(self, decision: DecisionMessage) -> PreviousSnapshot | None:
        if decision.previous is None:
            return None
        path = self._workdir.weights(decision.previous) / SNAPSHOT_FILE
        found = PreviousSnapshot.model_validate_json(path.read_text())
        return PreviousSnapshot(
            identity=decision.previous, digest=found.digest, tensors=found.tensors
        )

    # --- waiting for every rank ----------------------------------------------------

    async def _gather(self, seq: int, what: str, step: int, model: type[M]) -> list[M]:
        members = list(range(self._channel.members))
        keys = [key(seq, what, m) for m in members]
        await asyncio.to_thread(self._channel.wait, keys, step=step, watch=members)
        return [model.model_validate_json(self._channel.read(k)) for k in keys]


class PreviousSnapshot(BaseModel):
    identity: str = ""
    digest: str
    tensors: list[str]


def _write_snapshot_file(weights: Path, digest: str, tensors: list[str]) -> None:
    (weights / SNAPSHOT_FILE).write_text(json.dumps({"digest": digest, "tensors": tensors}))


def check_coverage(metas: tuple[TensorMeta, ...], proposals: list[Proposal], step: int) -> None:
    """Every tensor's elements are held by exactly one rank's blocks (``RankFailed``
    naming a rank that overlaps another or a range no rank holds)."""
    held: dict[int, list[tuple[int, int, int]]] = {}
    for rank, proposal in enumerate(proposals):
        for index, start, length in proposal.blocks:
            if not 0 <= index < len(metas):
                raise RankFailed("a rank holds an unknown tensor", rank=rank, step=step)
            held.setdefault(index, []).append((start, length, rank))
    for index, meta in enumerate(metas):
        numel = math.prod(meta.shape)
        end = 0
        for start, length, rank in sorted(held.get(index, [])):
            if start != end:
                raise RankFailed(
                    "the ranks' blocks of a tensor overlap"
                    if start < end
                    else "no rank holds some rows of a tensor",
                    rank=rank,
                    step=step,
                    tensor=meta.name,
                    elements=f"{min(start, end)}..{max(start, end)}",
                )
            end = start + length
        if end != numel:
            raise RankFailed(
                "no rank holds some rows of a tensor"
                if end < numel
                else "a block runs past its tensor",
                rank=None,
                step=step,
                tensor=meta.name,
                elements=f"{min(end, numel)}..{max(end, numel)}",
            )
