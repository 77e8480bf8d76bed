"""What a fake engine is doing: served weights and their label, pauses, generations, cache.

Both fakes (SGLang-like, vLLM-like) share this state machine; they differ in routes,
shapes and in a few rules the released servers differ on, passed in as flags. A
generation produces one token every ``token_interval`` seconds; each token's text is the
first hex digits of the weights digest at that moment, so a completion shows which bytes
produced it, and the label in force is recorded per token (SGLang's and vLLM's weight
version spans). The prefix cache is modelled per prompt with the label of the weights its
KV was computed with: a request that reuses an entry made under other weights counts as a
*stale hit*, the thing a cache policy of ``all`` must prevent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from hotload.testing.weights import LoadFailedMidway, TensorStore
from hotload.waiting import wait_until_async

TOKEN_DIGITS = 6


class Pause(StrEnum):
    """How a pause treats running generations (the union of both engines' modes)."""

    IN_PLACE = "in_place"
    """SGLang ``in_place`` / vLLM ``keep``: hold between tokens, keep their KV."""
    RETRACT = "retract"
    """SGLang ``retract``: hold, drop their KV (re-prefilled on continue)."""
    ABORT = "abort"
    """Abort them."""
    WAIT = "wait"
    """vLLM ``wait``: let them finish; new ones wait."""


@dataclass
class Generation:
    """One request being generated."""

    prompt: str
    max_tokens: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    spans: list[dict[str, Any]] = field(default_factory=list)
    """``[{version, start, end}]`` over output tokens, as both engines report them."""
    text: list[str] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str | None = None
    kv_dropped: bool = False

    @property
    def tokens(self) -> int:
        return len(self.text)

    def record(self, version: str) -> None:
        index = self.tokens
        if self.spans and self.spans[-1]["version"] == version:
            self.spans[-1]["end"] = index + 1
        else:
            self.spans.append({"version": version, "start": index, "end": index + 1})


@dataclass(frozen=True)
class Rules:
    """Where the released engines differ."""

    new_requests_refused_when: frozenset[Pause] = frozenset()
    """vLLM answers 503 to new requests while paused in ``abort``/``wait``."""


class Admission(Protocol):
    """What a request holds while it runs, taken after the pause lets it in."""

    async def admit(self) -> None:
        """Take it (an exception refuses the request)."""
        ...

    async def release(self) -> None:
        """Give it back when the request ends."""
        ...


class RefusedWhilePaused(Exception):
    """A new request arrived while the engine refuses them (vLLM abort/wait pauses)."""


class FakeEngineState:
    def __init__(
        self,
        *,
        version: str,
        served_name: str,
        model_path: str,
        rules: Rules,
        token_interval: float = 0.02,
    ) -> None:
        self.store = TensorStore()
        self.digest = self.store.digest()
        self.version = version
        self.served_name = served_name
        self.model_path = model_path
        self.rules = rules
        self.token_interval = token_interval
        self.instance_id = str(time.time_ns())
        self.paused: Pause | None = None
        self.running: dict[str, Generation] = {}
        self.cache: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        self.fail_next_load: int | None = None
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._gate_open = asyncio.Event()
        self._gate_open.set()
        self._changed = asyncio.Condition()
        self.details: dict[str, Callable[[], Any]] = {}
        """More of an app's own state for :meth:`describe` (the SGLang fake's adapters)."""

    # --- weights -------------------------------------------------------------------

    async def load(self, path: Path) -> int:
        """Replace the weights from ``path``; :class:`LoadFailedMidway` when a fault was armed."""
        fail_after, self.fail_next_load = self.fail_next_load, None
        try:
            return await asyncio.to_thread(self.store.load, path, fail_after=fail_after)
        except LoadFailedMidway:
            self.counters["failed_loads"] += 1
            raise
        finally:
            self.digest = self.store.digest()
            self.counters["loads"] += 1

    async def exclusive(self, action: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``action`` with new requests held and in-flight ones finished (a writer lock)."""
        self._gate_open.clear()
        try:
            await self.wait_idle(timeout=None)
            return await action()
        finally:
            self._gate_open.set()

    # --- pause ---------------------------------------------------------------------

    async def pause(self, mode: Pause) -> None:
        self.paused = mode
        self._unpaused.clear()
        if mode is Pause.ABORT:
            for generation in self.running.values():
                generation.finish_reason = "abort"
                self.counters["aborted"] += 1
        elif mode is Pause.RETRACT:
            self.preempt("retracted")
        if mode in (Pause.WAIT, Pause.ABORT):
            await self.wait_idle(timeout=None)
        await self._notify()

    def preempt(self, why: str) -> None:
        """Drop running generations' KV (they re-prefill on the weights served then)."""
        for generation in self.running.values():
            if not generation.kv_dropped:
                generation.kv_dropped = True
                self.counters[why] += 1

    async def resume(self) -> None:
        self.paused = None
        self._unpaused.set()
        await self._notify()

    # --- cache ---------------------------------------------------------------------

    def running_batch(self) -> int:
        """Generations holding KV in the running batch (retracted ones do not)."""
        return sum(1 for g in self.running.values() if not g.kv_dropped)

    async def flush(self, *, timeout: float, ignore_held: bool) -> bool:
        """Drop every cache entry once the running batch is empty; False at ``timeout``."""

        async def idle() -> bool:
            busy = self.running_batch() if ignore_held else len(self.running)
            return busy == 0

        if not await wait_until_async(idle, timeout, interval_s=0.02):
            self.counters["flushes_refused"] += 1
            return False
        self.cache.clear()
        self.counters["flushes"] += 1
        return True

    # --- generation ----------------------------------------------------------------

    async def generate(
        self,
        prompt: str,
        max_tokens: int,
        on_token: Callable[[Generation, str], Awaitable[None]],
        *,
        admission: Admission | None = None,
    ) -> Generation:
        """Generate ``max_tokens`` tokens (calls ``on_token`` for each) and return the result.

        ``admission`` runs once the request passed the pause and the update lock (SGLang
        resolves and counts a request's LoRA adapter there), its release when it ends."""
        self.check_accepting()
        await self._gate_open.wait()
        await self._unpaused.wait()
        if admission is not None:
            await admission.admit()
        generation = Generation(prompt, max_tokens)
        self.running[generation.id] = generation
        try:
            self._prefill(generation)
            while generation.tokens < max_tokens and generation.finish_reason is None:
                await self._hold(generation)
                if generation.finish_reason is not None:
                    break
                await asyncio.sleep(self.token_interval)
                if generation.finish_reason is not None:
                    break
                generation.record(self.version)
                token = self.digest[:TOKEN_DIGITS] + " "
                generation.text.append(token)
                await on_token(generation, token)
            if generation.finish_reason is None:
                generation.finish_reason = "length"
            if generation.finish_reason != "abort":
                self.cache[prompt] = self.version
            return generation
        finally:
            del self.running[generation.id]
            if admission is not None:
                await admission.release()
            await self._notify()

    def check_accepting(self) -> None:
        """``RefusedWhilePaused`` when a new request would get 503 (vLLM abort/wait)."""
        if self.paused in self.rules.new_requests_refused_when:
            raise RefusedWhilePaused(self.paused)

    def _prefill(self, generation: Generation) -> None:
        label = self.cache.get(generation.prompt)
        if label is None:
            return
        generation.cached_tokens = len(generation.prompt)
        if label != self.version:
            self.counters["stale_cache_hits"] += 1

    async def _hold(self, generation: Generation) -> None:
        while self.paused in (Pause.IN_PLACE, Pause.RETRACT) and generation.finish_reason is None:
            await self._unpaused.wait()
        if generation.kv_dropped:
            generation.kv_dropped = False
            self.counters["reprefilled"] += 1

    async def wait_idle(self, timeout: float | None) -> bool:
        """Until nothing is generating; False if ``timeout`` passed first."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: not self.running), timeout=timeout
                )
            except TimeoutError:
                return False
        return True

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def describe(self) -> dict[str, Any]:
        """The fake's own state, for tests (``GET /hotload_fake/state``)."""
        return {
            "version": self.version,
            "digest": self.digest,
            "checksums": self.store.checksums(),
            "model_path": self.model_path,
            "served_name": self.served_name,
            "instance_id": self.instance_id,
            "paused": self.paused.value if self.paused else None,
            "running": len(self.running),
            "cache": dict(self.cache),
            "counters": dict(self.counters),
            **{name: detail() for name, detail in self.details.items()},
        }
