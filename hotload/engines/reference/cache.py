"""The reference engine's prompt (KV) cache and the three post-swap policies.

Entries are keyed by session (``x-multi-turn-session-id``; requests without one get an
anonymous entry each) and hold the KV of every token the request fed. A new request
reuses the longest common token prefix of any entry it may see — its own session's, or a
*shared* entry — like a radix cache would; reuse is reported as
``usage.prompt_tokens_details.cached_tokens``. After a swap:

- ``all``: every entry is dropped.
- ``none``: every entry stays usable by everyone.
- ``new_session``: entries stay, but each is sealed to its own session: running sessions
  keep their KV, while new sessions (and requests without a session) never reuse KV that
  the old weights computed.

Old KV never leaks through a request either: an entry built on a sealed entry stays
sealed, and a request that started before a reset stores its KV under that reset's rule
(dropped after ``all``, sealed after ``new_session``).

Entries are bounded (LRU). Each lookup hands out a private copy, cropped to the reused
length, so concurrent requests never share a mutable cache.
"""

from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from transformers import DynamicCache

from hotload.api import KvCachePolicy
from hotload.api.kinds import Identity

DEFAULT_CAPACITY: Final = 64
_ANONYMOUS: Final = "\x00anonymous-"


@dataclass
class CacheEntry:
    session: str | None
    tokens: tuple[int, ...]
    kv: DynamicCache
    identity: Identity
    """The weights that computed this KV."""
    sealed: bool = False
    """After a ``new_session`` reset: only its own session may reuse it."""


@dataclass(frozen=True)
class CacheHit:
    kv: DynamicCache | None
    reused_tokens: int
    epoch: int
    """The cache's reset count when the request started (pass it back to ``store``)."""
    sealed: bool = False
    """The reused KV came from a sealed entry."""


def _common_prefix(left: Sequence[int], right: Sequence[int]) -> int:
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


class PromptCache:
    """Session-keyed KV entries with prefix reuse and the post-swap policies."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self._anonymous = itertools.count()
        self._resets: list[KvCachePolicy] = []
        """Every ``all``/``new_session`` reset so far; its length is the epoch."""

    def lookup(self, session: str | None, prompt: Sequence[int]) -> CacheHit:
        """A private copy of the best reusable KV for ``prompt`` (one token always stays)."""
        best: CacheEntry | None = None
        best_length = 0
        for entry in self._entries.values():
            if entry.sealed and (session is None or entry.session != session):
                continue
            length = min(_common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if length > best_length:
                best, best_length = entry, length
        epoch = len(self._resets)
        if best is None or best_length <= 0:
            return CacheHit(None, 0, epoch)
        kv = copy.deepcopy(best.kv)
        surplus = len(best.tokens) - best_length
        if surplus > 0:
            kv.crop(-surplus)
        return CacheHit(kv, best_length, epoch, best.sealed)

    def store(
        self,
        session: str | None,
        tokens: Sequence[int],
        kv: DynamicCache,
        identity: Identity,
        hit: CacheHit,
    ) -> None:
        """Remember the KV of ``tokens`` (its length must equal the tokens fed), under the
        rules of any reset that happened since the request's ``hit``."""
        since = self._resets[hit.epoch :]
        if not tokens or KvCachePolicy.ALL in since:
            return
        sealed = hit.sealed or KvCachePolicy.NEW_SESSION in since
        if sealed and session is None:
            return
        key = session if session is not None else f"{_ANONYMOUS}{next(self._anonymous)}"
        self._entries.pop(key, None)
        self._entries[key] = CacheEntry(session, tuple(tokens), kv, identity, sealed)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def apply(self, policy: KvCachePolicy) -> int:
        """Apply a post-swap policy; returns how many entries were dropped."""
        if policy is not KvCachePolicy.NONE:
            self._resets.append(policy)
        if policy is KvCachePolicy.ALL:
            dropped = len(self._entries)
            self._entries.clear()
            return dropped
        if policy is KvCachePolicy.NEW_SESSION:
            anonymous = [key for key, entry in self._entries.items() if entry.session is None]
            for key in anonymous:
                del self._entries[key]
            for entry in self._entries.values():
                entry.sealed = True
            return len(anonymous)
        return 0

    def describe(self) -> list[dict[str, Any]]:
        """What ``GET /admin/cache`` shows."""
        return [
            {
                "session": entry.session,
                "tokens": len(entry.tokens),
                "identity": entry.identity,
                "sealed": entry.sealed,
            }
            for entry in self._entries.values()
        ]
