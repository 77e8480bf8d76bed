"""The ranks' line to each other during a sharded publish: keys in the job's own
key-value store (the one ``torch.distributed`` rendezvoused through), under a prefix of
the deployment's.

Nothing here uses the training job's process groups: the training loop may run
collectives on them at the same moment, and an exchange of ours interleaved with one
of its own would hang both. The store is also where a silent rank shows: every
publisher bumps a heartbeat counter every second from a thread of its own, and a wait
that watches a rank gives up on it (:class:`RankFailed`) once its counter has not
moved for ``silence_s`` — a killed process, a frozen host. A wait also ends at once
when the round's outcome appears (the coordinator gave up on the round), so no rank
waits for a key that will never come.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, Final, Protocol

from hotload.errors import RankFailed

log = logging.getLogger(__name__)

HEARTBEAT_S: Final = 1.0
POLL_MIN_S: Final = 0.001
POLL_MAX_S: Final = 0.05
LIVENESS_EVERY_S: Final = 0.5


class KeyValueStore(Protocol):
    """What we use of ``torch.distributed.Store``."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def add(self, key: str, amount: int) -> int: ...

    def delete_key(self, key: str) -> bool: ...


class RoundAborted(Exception):
    """The round's outcome appeared while this rank was waiting (raised to the round,
    which reads the outcome)."""


class RankChannel:
    """Keys of one publisher's rounds, and the liveness of its ranks."""

    def __init__(
        self,
        store: KeyValueStore,
        *,
        member: int,
        members: int,
        silence_s: float,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self._store = store
        self.member = member
        self.members = members
        self._silence_s = silence_s
        self._heartbeat_s = heartbeat_s
        self._seen: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._beating, name="hotload-heartbeat", daemon=True)
        self._thread.start()

    # --- keys ------------------------------------------------------------------------

    def post(self, key: str, value: bytes) -> None:
        self._call(self._store.set, key, value)

    def read(self, key: str) -> bytes:
        value: bytes = self._call(self._store.get, key)
        return value

    def take(self, key: str) -> bytes:
        """Read a key and delete it (a value meant for this rank alone)."""
        value = self.read(key)
        self.drop([key])
        return value

    def drop(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._call(self._store.delete_key, key)

    def wait(
        self,
        keys: list[str],
        *,
        step: int,
        watch: Iterable[int],
        abort: str | None = None,
        deadline: float | None = None,
    ) -> None:
        """Until every key exists. :class:`RankFailed` names the first watched rank that
        fell silent (or, past ``deadline``, the first rank whose key is missing: keys end
        in ``/<rank>``); :class:`RoundAborted` when ``abort`` appears first."""
        watched = [m for m in watch if m != self.member]
        interval = POLL_MIN_S
        checked = time.monotonic()
        while True:
            if self._call(self._store.check, keys):
                return
            if abort is not None and self._call(self._store.check, [abort]):
                raise RoundAborted(abort)
            now = time.monotonic()
            if now - checked >= LIVENESS_EVERY_S:
                checked = now
                for member in watched:
                    self._check_alive(member, step)
            if deadline is not None and now > deadline:
                missing = [k for k in keys if not self._call(self._store.check, [k])]
                raise RankFailed(
                    "a rank did not report in time",
                    rank=_rank_of(missing[0]) if missing else None,
                    step=step,
                    missing=missing[:5],
                )
            time.sleep(interval)
            interval = min(POLL_MAX_S, interval * 2)

    def acknowledge(self, key: str) -> None:
        """Say this rank has read ``key`` (the coordinator's word)."""
        self._call(self._store.set, f"{key}/ack/{self.member}", b"1")

    def wait_acknowledged(self, key: str, *, step: int) -> None:
        """Until every other rank acknowledged ``key`` or fell silent (a rank that died
        never will; a rank named in a failed round's error may well be alive, and hear
        it). The rank hosting the job's store (rank 0, with torchrun's default) may exit
        once its round ends: the others must have read the outcome by then, or they
        would hear a dead store instead of it."""
        waiting = {m for m in range(self.members) if m != self.member}
        acks = {m: f"{key}/ack/{m}" for m in waiting}
        interval = POLL_MIN_S
        checked = time.monotonic()
        while waiting:
            waiting = {m for m in waiting if not self._call(self._store.check, [acks[m]])}
            now = time.monotonic()
            if waiting and now - checked >= LIVENESS_EVERY_S:
                checked = now
                for member in sorted(waiting):
                    try:
                        self._check_alive(member, step)
                    except RankFailed:
                        log.warning(
                            "a silent rank did not acknowledge the round's outcome",
                            extra={"key": key, "rank": member},
                        )
                        waiting.discard(member)
            if waiting:
                time.sleep(interval)
                interval = min(POLL_MAX_S, interval * 2)
        self.drop(acks.values())

    def _check_alive(self, member: int, step: int) -> None:
        count = int(self._call(self._store.add, f"alive/{member}", 0))
        now = time.monotonic()
        seen = self._seen.get(member)
        if seen is None or seen[0] != count:
            self._seen[member] = (count, now)
            return
        if now - seen[1] > self._silence_s:
            raise RankFailed(
                "a rank stopped answering during a sharded publish",
                rank=member,
                step=step,
                silent_s=round(now - seen[1], 1),
            )

    # --- liveness --------------------------------------------------------------------

    def _beat(self) -> None:
        self._store.add(f"alive/{self.member}", 1)

    def _beating(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                self._beat()
            except Exception as err:  # the store is gone: every wait will say so
                log.warning("cannot reach the job's store", extra={"error": str(err)[:200]})
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _call(self, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except RuntimeError as err:  # torch.distributed's DistStoreError/DistNetworkError
            raise RankFailed(
                "the job's key-value store stopped answering (the process hosting it failed?)",
                rank=None,
                error=str(err)[:300],
            ) from err


def _rank_of(key: str) -> int | None:
    tail = key.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None
