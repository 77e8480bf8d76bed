"""One rank's side of a sharded publish round (every rank runs it, rank 0 too).

1. Propose: post what this rank holds (its blocks of each tensor), the step, and the
   base its next delta would be against.
2. Hear the decision (rank 0 makes it: :class:`~hotload.publish.commit.Coordinator`).
3. Encode its blocks into a payload file of its own (as they are for a Full, each
   against the same block of its base for a delta) while, beside it, hashing them in
   turn with the ranks that hold the rows before and after its own
   (:class:`~hotload.snapshot.stream_hash.StreamHash`): the rank holding a tensor's last
   rows ends up with the whole tensor's xxh3-128, without anyone gathering it. Upload
   the payload file to every bucket the decision names, keep the blocks as a candidate
   base, and report (files, parts, hashes — or the error).
4. Hear the outcome: the result every rank returns (the candidate becomes the base), or
   the error every rank raises (:class:`~hotload.errors.RankFailed`, naming the rank
   and the step; the base stays the last committed one).

The keys of a round are described in :mod:`hotload.publish.rank_messages`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel

from hotload.api import SnapshotKind
from hotload.errors import HotloadError, RankFailed
from hotload.publish.buckets import BucketOpener
from hotload.publish.commit import Coordinator, RoundTiming, key
from hotload.publish.rank_channel import RankChannel, RoundAborted
from hotload.publish.rank_dir import Base, RankDir, layout_digest
from hotload.publish.rank_messages import (
    BaseRef,
    Decision,
    Outcome,
    Proposal,
    Report,
)
from hotload.publish.region_client import RegionBucket
from hotload.publish.results import PublishResult, RankResult
from hotload.publish.sharding import HeldWeights
from hotload.snapshot.codec.tensor_codec import CodecOptions
from hotload.snapshot.manifest import StoredFile, TensorPart
from hotload.snapshot.parted import PartsWriter, TensorMeta
from hotload.snapshot.stream_hash import StreamHash

M = TypeVar("M", bound=BaseModel)
COORDINATOR = 0


@dataclass(frozen=True)
class RoundSettings:
    encode_threads: int
    open_bucket: BucketOpener


class RankRounds:
    """Runs this rank's rounds in order (one per publish, one more per fallback Full)."""

    def __init__(
        self,
        *,
        channel: RankChannel,
        rank_dir: RankDir,
        settings: RoundSettings,
        coordinator: Coordinator | None,
    ) -> None:
        self._channel = channel
        self._dir = rank_dir
        self._settings = settings
        self._coordinator = coordinator
        self._seq = 0
        self.member = channel.member

    async def publish(
        self,
        step: int,
        held: HeldWeights | HotloadError,
        full: bool,
        timing: RoundTiming,
        why: str | None = None,
    ) -> PublishResult:
        """One round (and its fallback Full, if a region broke the chain). ``held`` is
        this rank's capture, or the error that stopped it: the rank still proposes (its
        error), so every rank hears that the round failed, naming this rank."""
        seq = self._seq
        self._seq += 1
        if isinstance(held, HotloadError):
            await self._fail(seq, step, held)
        result, fallback = await self._round(seq, step, held, full, timing)
        if why is not None:
            result = result.model_copy(update={"why": why})
        if fallback:
            again = await self.publish(
                step, held, True, RoundTiming(time.monotonic()), why="chain-broken"
            )
            result = result.model_copy(update={"fallback": again})
        return result

    async def _fail(self, seq: int, step: int, error: HotloadError) -> NoReturn:
        proposal = Proposal(
            step=step, full=False, tensors="", blocks=[], layout="", base=None, error=str(error)
        )
        self._channel.post(key(seq, "propose", self.member), proposal.model_dump_json().encode())
        if self._coordinator is not None:
            decision = await self._coordinator.decide(seq, step, ())
        else:
            decision = await self._hear(seq, "decision", step, Decision)
        raise RankFailed(
            decision.error or str(error), rank=decision.failed_rank, step=step
        ) from error

    async def _round(
        self, seq: int, step: int, held: HeldWeights, full: bool, timing: RoundTiming
    ) -> tuple[PublishResult, bool]:
        layout = layout_digest(held.blocks)
        base = self._dir.base()
        proposal = Proposal(
            step=step,
            full=full,
            tensors=metas_digest(held.metas),
            blocks=_block_rows(held),
            layout=layout,
            base=BaseRef(identity=base.identity, layout=base.layout) if base else None,
        )
        self._channel.post(key(seq, "propose", self.member), proposal.model_dump_json().encode())
        if self._coordinator is not None:
            decision = await self._coordinator.decide(seq, step, held.metas)
        else:
            decision = await self._hear(seq, "decision", step, Decision)
        if decision.error is not None:
            raise RankFailed(decision.error, rank=decision.failed_rank, step=step)
        try:
            report = await self._encode(seq, step, decision, held, base)
        except RoundAborted:
            report = None
        except HotloadError as err:
            report = Report(error=str(err))
        if report is not None:
            self._channel.post(key(seq, "report", self.member), report.model_dump_json().encode())
        if self._coordinator is not None:
            outcome = await self._coordinator.commit(seq, step, decision, held.metas, timing)
        else:
            outcome = await self._hear(seq, "outcome", step, Outcome)
        if outcome.error is not None or outcome.result is None:
            self._dir.forget()
            raise RankFailed(
                outcome.error or "the round ended without a result",
                rank=outcome.failed_rank,
                step=step,
            )
        self._dir.promote(decision.identity, layout)
        own = next((r for r in outcome.result.ranks if r.rank == self.member), None)
        result = outcome.result.model_copy(
            update={
                "blocked_seconds": round(timing.blocked_seconds, 6),
                "encode_seconds": own.encode_seconds if own else outcome.result.encode_seconds,
            }
        )
        return result, outcome.fallback

    async def _hear(self, seq: int, what: str, step: int, model: type[M]) -> M:
        """Wait for the coordinator's word (watching that it stays alive), and say it was
        heard when it ends the round (an outcome, or a decision that failed it)."""
        name = key(seq, what)
        await asyncio.to_thread(self._channel.wait, [name], step=step, watch=[COORDINATOR])
        word = model.model_validate_json(self._channel.read(name))
        if what == "outcome" or getattr(word, "error", None) is not None:
            self._channel.acknowledge(name)
        return word

    # --- encode, hash, upload ------------------------------------------------------

    async def _encode(
        self, seq: int, step: int, decision: Decision, held: HeldWeights, base: Base | None
    ) -> Report:
        complete = decision.kind is not SnapshotKind.INCREMENTAL
        coordinator = self._coordinator
        out = (
            coordinator.encoded_dir(decision.identity)
            if coordinator is not None
            else self._dir.encoded(decision.identity)
        )
        relpath = f"hotload-parts-{self.member:05d}.bin"
        chain = asyncio.to_thread(self._hash_chain, seq, step, held)
        encode = asyncio.to_thread(
            self._encode_blocks, held, None if complete else base, out, relpath, complete
        )
        hashes, (payload, parts, rank) = await asyncio.gather(chain, encode)
        await asyncio.to_thread(self._dir.save_candidate, decision.identity, held.blocks)
        if payload is not None and coordinator is None:
            await self._upload(decision, out / relpath, relpath)
        return Report(payload=payload, parts=parts, hashes=hashes, rank=rank)

    def _encode_blocks(
        self,
        held: HeldWeights,
        base: Base | None,
        out: Any,
        relpath: str,
        complete: bool,
    ) -> tuple[StoredFile | None, dict[str, list[TensorPart]], RankResult]:
        started, cpu = time.monotonic(), time.thread_time()
        threads = self._settings.encode_threads
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        try:
            writer = PartsWriter(out, relpath, options=CodecOptions(), executor=pool)
            parts: dict[str, list[TensorPart]] = {}
            dtypes = {meta.name: meta.dtype for meta in held.metas}
            with self._dir.previous(base) as previous:
                for block in held.blocks:
                    parts.setdefault(block.name, []).append(
                        writer.add(
                            dtypes[block.name],
                            block.start,
                            block.words(),
                            previous.words(block),
                            complete=complete,
                        )
                    )
            payload = writer.close()
        finally:
            if pool is not None:
                pool.shutdown()
        rank = RankResult(
            rank=self.member,
            stored_bytes=payload.size if payload else 0,
            tensor_bytes=sum(b.data.numel() * b.data.element_size() for b in held.blocks),
            encode_seconds=round(time.monotonic() - started, 3),
            encode_cpu_seconds=round(time.thread_time() - cpu, 3),
        )
        return payload, parts, rank

    def _hash_chain(self, seq: int, step: int, held: HeldWeights) -> dict[str, str]:
        """Hash this rank's blocks in their turn: each continues the state the rank with
        the rows before it left (under ``hash/<tensor>/<start>``) and leaves its own
        for the next; the rank with a tensor's last rows keeps the digest."""
        index = {meta.name: i for i, meta in enumerate(held.metas)}
        numel = {meta.name: math.prod(meta.shape) for meta in held.metas}
        outcome = key(seq, "outcome")
        # Rank 0 watches every rank (it must not wait for a dead one); the others watch
        # rank 0, which ends the round (the outcome appears) when one of them dies.
        watch = range(self._channel.members) if self._coordinator else [COORDINATOR]
        hashes: dict[str, str] = {}
        for block in sorted(held.blocks, key=lambda b: (index[b.name], b.start)):
            tensor = index[block.name]
            if block.start == 0:
                state = StreamHash()
            else:
                name = key(seq, "hash", tensor, block.start)
                self._channel.wait([name], step=step, watch=watch, abort=outcome)
                try:
                    state = StreamHash.from_bytes(self._channel.take(name))
                except ValueError as err:
                    raise RankFailed("a rank passed a damaged hash state", step=step) from err
            state.update(block.words().data)
            end = block.start + block.length
            if end == numel[block.name]:
                hashes[block.name] = state.hexdigest()
            else:
                self._channel.post(key(seq, "hash", tensor, end), state.to_bytes())
        return hashes

    async def _upload(self, decision: Decision, path: Any, relpath: str) -> None:
        """This rank's payload file into every bucket the decision names."""
        for ref in decision.buckets:
            bucket = RegionBucket(
                context=ref.context,
                bucket_url=ref.bucket_url,
                endpoint=ref.endpoint,
                region=ref.region,
            )
            storage = self._settings.open_bucket(bucket)
            try:
                await storage.put_file(f"{decision.identity}/{relpath}", path)
            finally:
                await storage.aclose()


def _block_rows(held: HeldWeights) -> list[tuple[int, int, int]]:
    index = {meta.name: i for i, meta in enumerate(held.metas)}
    return [(index[b.name], b.start, b.length) for b in held.blocks]


def metas_digest(metas: tuple[TensorMeta, ...]) -> str:
    """What every rank must agree on: the gathered state_dict's names, dtypes, shapes."""
    rows = [(m.name, m.dtype, list(m.shape)) for m in metas]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()
