"""What the ranks of a sharded publish tell each other, one JSON document a key.

A round of sequence number ``n`` (every rank counts its publishes alike) uses:
``n/propose/<rank>`` (each rank: its step, what it holds, its base), ``n/decision``
(the coordinator: the snapshot to write, or why not), ``n/hash/<tensor>/<offset>`` (the
hash state of a tensor's first ``offset`` elements, for the rank that holds the next
ones), ``n/report/<rank>`` (each rank: its payload file and parts, or its error) and
``n/outcome`` (the coordinator: the result every rank returns, or the error every rank
raises).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from hotload.api import SnapshotKind
from hotload.publish.results import PublishResult, RankResult
from hotload.snapshot.manifest import StoredFile, TensorPart


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BaseRef(Message):
    identity: str
    layout: str


class Proposal(Message):
    step: int
    full: bool
    tensors: str
    """Digest of every tensor's name, dtype and shape (the same state_dict everywhere)."""
    blocks: list[tuple[int, int, int]]
    """(tensor index, start, length) of each block this rank will publish."""
    layout: str
    base: BaseRef | None
    error: str | None = None


class BucketRef(Message):
    context: str
    bucket_url: str
    endpoint: str | None
    region: str | None


class Decision(Message):
    identity: str = ""
    kind: SnapshotKind = SnapshotKind.FULL
    previous: str | None = None
    why: str = ""
    buckets: list[BucketRef] = []
    """Where every rank writes its payload file."""
    error: str | None = None
    failed_rank: int | None = None


class Report(Message):
    payload: StoredFile | None = None
    parts: dict[str, list[TensorPart]] = {}
    hashes: dict[str, str] = {}
    """Whole-tensor xxh3-128 of the tensors whose last rows this rank holds."""
    rank: RankResult | None = None
    error: str | None = None


class Outcome(Message):
    result: PublishResult | None = None
    fallback: bool = False
    """A region broke the chain: every rank publishes a Full of the same weights next."""
    error: str | None = None
    failed_rank: int | None = None
