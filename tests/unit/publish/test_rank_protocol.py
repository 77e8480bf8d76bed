"""The coordinator's decision in a sharded publish, and the ranks' liveness, over an
in-memory key-value store (the real one is torch.distributed's; the jobs in
tests/integration/publish run it).

Would catch: blocks that overlap or leave rows to nobody getting past the decision (a
manifest would then be written for weights nobody wrote, or twice); ranks publishing
different steps or state_dicts; a delta when one rank's base is not the last committed
snapshot (it would encode against other weights than the replicas hold); a silent rank
waited for forever.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hotload.api import SnapshotKind
from hotload.errors import RankFailed
from hotload.publish.commit import SNAPSHOT_FILE, Coordinator, key
from hotload.publish.deciding import KindChooser
from hotload.publish.observer import NullObserver
from hotload.publish.rank_channel import RankChannel
from hotload.publish.rank_messages import BaseRef, Decision, Proposal
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.settings import PublisherSettings
from hotload.publish.state import LastSnapshot, PublisherState, WorkDir
from hotload.snapshot.parted import TensorMeta

METAS = (TensorMeta("a", "BF16", (4, 3)), TensorMeta("b", "F32", (5,)))


class MemoryStore:
    """torch.distributed's Store, as far as the channel uses it."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: bytes) -> None:
        with self.lock:
            self.values[key] = value

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.values[key]

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(k in self.values for k in keys)

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            value = int(self.values.get(key, b"0")) + amount
            self.values[key] = str(value).encode()
            return value

    def delete_key(self, key: str) -> bool:
        with self.lock:
            return self.values.pop(key, None) is not None


async def _never_delivered(*args: Any) -> Any:
    raise AssertionError("these tests stop at the decision")


def coordinator(
    tmp_path: Path, store: MemoryStore, members: int = 2, silence_s: float = 0.3
) -> Coordinator:
    """Rank 0's side; a rank that does not move its heartbeat for ``silence_s`` is dead
    (the proposals below bump it once: a rank that failed a round never hears it)."""
    settings = PublisherSettings(deployment="d", contexts=("r",), workdir=tmp_path / "w")
    workdir = WorkDir(settings.workdir)
    state = PublisherState(deployment="d", namespace="default")
    buckets = RegionBuckets({}, home=None, endpoints={}, open_bucket=lambda b: None)  # type: ignore[arg-type,return-value]
    channel = RankChannel(store, member=0, members=members, silence_s=silence_s, heartbeat_s=0.1)
    return Coordinator(
        settings=settings,
        workdir=workdir,
        state=state,
        chooser=KindChooser(state, {}, settings.full_every),
        buckets=buckets,
        deliver=_never_delivered,
        channel=channel,
        observer=NullObserver(),
    )


def propose(
    store: MemoryStore, member: int, blocks: list[tuple[int, int, int]], **fields: object
) -> None:
    body = {
        "step": 3,
        "full": False,
        "tensors": "t",
        "blocks": blocks,
        "layout": f"l{member}",
        "base": None,
    }
    body.update(fields)
    store.set(key(0, "propose", member), Proposal.model_validate(body).model_dump_json().encode())
    store.add(f"alive/{member}", 1)


HALVES = ([(0, 0, 6), (1, 0, 5)], [(0, 6, 6)])
"""Rank 0: the first two rows of ``a`` and all of ``b``; rank 1: the last two rows."""


def decide(coordinator: Coordinator) -> Decision:
    return asyncio.run(coordinator.decide(0, 3, METAS))


def test_blocks_that_tile_every_tensor_make_a_full(tmp_path: Path) -> None:
    store = MemoryStore()
    propose(store, 0, HALVES[0])
    propose(store, 1, HALVES[1])
    decision = decide(coordinator(tmp_path, store))
    assert (decision.error, decision.kind, decision.why) == (None, SnapshotKind.FULL, "first")
    assert decision.identity == "d-step-3-full"
    assert store.check([key(0, "decision")]) and not store.check([key(0, "propose", 0)])


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        ([(0, 3, 9)], "overlap"),
        ([(0, 9, 3)], "no rank holds"),
        ([(0, 6, 3)], "no rank holds"),
        ([(0, 6, 6), (1, 4, 1)], "overlap"),
        ([(0, 6, 9)], "past its tensor"),
        ([(7, 0, 1)], "unknown tensor"),
    ],
)
def test_blocks_that_overlap_or_leave_rows_to_nobody_fail_the_round(
    tmp_path: Path, second: list[tuple[int, int, int]], problem: str
) -> None:
    store = MemoryStore()
    propose(store, 0, HALVES[0])
    propose(store, 1, second)
    decision = decide(coordinator(tmp_path, store))
    assert decision.error is not None and problem in decision.error, decision


@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"step": 4}, "different steps"), ({"tensors": "other"}, "different state_dicts")],
)
def test_ranks_that_disagree_on_step_or_state_dict_fail_the_round_naming_the_rank(
    tmp_path: Path, fields: dict[str, object], problem: str
) -> None:
    store = MemoryStore()
    propose(store, 0, HALVES[0])
    propose(store, 1, HALVES[1], **fields)
    decision = decide(coordinator(tmp_path, store))
    assert problem in (decision.error or "") and decision.failed_rank == 1


def _committed(coordinator: Coordinator, tmp_path: Path) -> None:
    """The last committed snapshot: step 2's Full, its weights and digest file kept."""
    weights = tmp_path / "w" / "weights" / "d-step-2-full"
    weights.mkdir(parents=True)
    (weights / SNAPSHOT_FILE).write_text('{"digest": "0", "tensors": ["a", "b"]}')
    coordinator._state.last = LastSnapshot(
        identity="d-step-2-full", step=2, kind=SnapshotKind.FULL, last_full_step=2,
        weights=str(weights),
    )  # fmt: skip


def test_a_delta_when_every_base_is_the_last_committed_snapshot(tmp_path: Path) -> None:
    store = MemoryStore()
    for member, blocks in enumerate(HALVES):
        base = BaseRef(identity="d-step-2-full", layout=f"l{member}")
        propose(store, member, blocks, base=base.model_dump())
    chosen = coordinator(tmp_path, store)
    _committed(chosen, tmp_path)
    decision = decide(chosen)
    assert (decision.kind, decision.previous) == (SnapshotKind.INCREMENTAL, "d-step-2-full")


@pytest.mark.parametrize(
    "base",
    [None, {"identity": "d-step-1", "layout": "l1"}, {"identity": "d-step-2-full", "layout": "x"}],
)
def test_a_full_when_a_rank_base_disagrees_with_the_last_committed_snapshot(
    tmp_path: Path, base: dict[str, str] | None
) -> None:
    store = MemoryStore()
    propose(store, 0, HALVES[0], base={"identity": "d-step-2-full", "layout": "l0"})
    propose(store, 1, HALVES[1], base=base)
    chosen = coordinator(tmp_path, store)
    _committed(chosen, tmp_path)
    decision = decide(chosen)
    assert (decision.kind, decision.why) == (SnapshotKind.FULL, "ranks-disagree")


def test_a_rank_that_never_answers_fails_the_round_once_silent(tmp_path: Path) -> None:
    store = MemoryStore()
    propose(store, 0, HALVES[0])
    store.add("alive/1", 1)  # it lived once, then froze before proposing
    started = time.monotonic()
    decision = decide(coordinator(tmp_path, store, silence_s=1.0))
    assert decision.failed_rank == 1 and "stopped answering" in (decision.error or "")
    assert 1.0 <= time.monotonic() - started < 10


def test_a_wait_ends_when_the_round_outcome_appears() -> None:
    from hotload.publish.rank_channel import RoundAborted

    store = MemoryStore()
    channel = RankChannel(store, member=1, members=2, silence_s=30, heartbeat_s=0.1)
    try:
        store.add("alive/0", 1)
        threading.Timer(0.2, lambda: store.set("0/outcome", b"{}")).start()
        with pytest.raises(RoundAborted):
            channel.wait(["0/hash/0/6"], step=3, watch=[0], abort="0/outcome")
    finally:
        channel.close()


def test_a_silent_coordinator_ends_every_wait_with_rank_failed() -> None:
    store = MemoryStore()
    channel = RankChannel(store, member=1, members=2, silence_s=0.5, heartbeat_s=0.1)
    try:
        store.add("alive/0", 1)
        with pytest.raises(RankFailed) as caught:
            channel.wait(["0/decision"], step=7, watch=[0])
        assert (caught.value.context["rank"], caught.value.context["step"]) == (0, 7)
    finally:
        channel.close()


def test_a_rank_that_could_not_capture_fails_the_round_for_everyone(tmp_path: Path) -> None:
    store = MemoryStore()
    propose(store, 0, HALVES[0])
    propose(store, 1, [], error="a DTensor to publish is sharded or replicated")
    decision = decide(coordinator(tmp_path, store))
    assert decision.failed_rank == 1 and "sharded or replicated" in (decision.error or "")


def test_a_round_that_ends_in_error_waits_until_the_other_ranks_heard_it(
    tmp_path: Path,
) -> None:
    """The coordinator may host the job's store and exit once its round failed: before
    it returns, every live rank has read the word (else they would hear a dead store)."""
    store = MemoryStore()
    propose(store, 0, HALVES[0])
    propose(store, 1, HALVES[1], step=9)
    member = RankChannel(store, member=1, members=2, silence_s=30, heartbeat_s=0.1)
    heard: list[float] = []

    def rank_1() -> None:
        member.wait([key(0, "decision")], step=3, watch=[])
        time.sleep(0.3)
        heard.append(time.monotonic())
        member.acknowledge(key(0, "decision"))

    listener = threading.Thread(target=rank_1)
    listener.start()
    try:
        decision = decide(coordinator(tmp_path, store, silence_s=30))
        returned = time.monotonic()
    finally:
        listener.join(timeout=10)
        member.close()
    assert decision.failed_rank == 1 and heard and heard[0] <= returned
    assert not store.check([key(0, "decision") + "/ack/1"])
