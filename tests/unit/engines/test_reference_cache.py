"""The reference engine's prompt cache: prefix reuse, and no KV of old weights reaching a
session the policy says must start fresh — even through a request that spans the reset."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from hotload.api import KvCachePolicy
from hotload.engines.reference.cache import PromptCache


def kv(length: int) -> DynamicCache:
    cache = DynamicCache()
    cache.update(torch.randn(1, 2, length, 4), torch.randn(1, 2, length, 4), 0)
    return cache


def remember(
    cache: PromptCache, session: str | None, tokens: list[int], identity: str = "a"
) -> None:
    cache.store(session, tokens, kv(len(tokens)), identity, cache.lookup(session, tokens))


def test_reuses_the_longest_common_prefix_and_leaves_a_token_to_feed() -> None:
    cache = PromptCache()
    remember(cache, "s1", [1, 2, 3, 4, 5])
    remember(cache, "s2", [1, 2, 9])

    hit = cache.lookup("s3", [1, 2, 3, 4, 7, 8])
    assert hit.reused_tokens == 4
    assert hit.kv is not None and hit.kv.get_seq_length() == 4

    whole = cache.lookup("s1", [1, 2, 3, 4, 5])
    assert whole.reused_tokens == 4  # the last prompt token is always fed again
    assert cache.lookup("s1", [8, 9]).kv is None


def test_lookups_hand_out_private_copies() -> None:
    cache = PromptCache()
    remember(cache, "s1", [1, 2, 3, 4])
    first = cache.lookup("s1", [1, 2, 3, 4, 5])
    assert first.kv is not None
    first.kv.crop(-3)
    assert cache.lookup("s1", [1, 2, 3, 4, 5]).reused_tokens == 4


def test_all_forgets_everything() -> None:
    cache = PromptCache()
    remember(cache, "s1", [1, 2, 3])
    remember(cache, None, [1, 2, 4])
    assert cache.apply(KvCachePolicy.ALL) == 2
    assert cache.lookup("s1", [1, 2, 3, 5]).reused_tokens == 0


def test_none_keeps_everything_shared() -> None:
    cache = PromptCache()
    remember(cache, "s1", [1, 2, 3])
    assert cache.apply(KvCachePolicy.NONE) == 0
    assert cache.lookup("other", [1, 2, 3, 5]).reused_tokens == 3


def test_new_session_keeps_running_sessions_and_starts_new_ones_fresh() -> None:
    cache = PromptCache()
    remember(cache, "s1", [1, 2, 3])
    remember(cache, None, [1, 2, 3, 4])
    assert cache.apply(KvCachePolicy.NEW_SESSION) == 1  # the anonymous entry belongs to no session
    assert cache.lookup("s1", [1, 2, 3, 5]).reused_tokens == 3
    assert cache.lookup("s2", [1, 2, 3, 5]).reused_tokens == 0
    assert cache.lookup(None, [1, 2, 3, 5]).reused_tokens == 0
    assert [entry["sealed"] for entry in cache.describe()] == [True]


def test_kv_built_on_a_sealed_entry_stays_sealed() -> None:
    cache = PromptCache()
    remember(cache, "s1", [1, 2, 3])
    cache.apply(KvCachePolicy.NEW_SESSION)
    remember(cache, "s1", [1, 2, 3, 4, 5], identity="b")  # reuses old KV, adds new tokens
    assert cache.lookup("s2", [1, 2, 3, 4, 5, 6]).reused_tokens == 0


def test_a_request_spanning_a_reset_obeys_it_when_storing() -> None:
    cache = PromptCache()
    before_all = cache.lookup("s1", [1, 2, 3])
    cache.apply(KvCachePolicy.ALL)
    cache.store("s1", [1, 2, 3], kv(3), "a", before_all)
    assert cache.describe() == []

    before_new_session = cache.lookup("s2", [4, 5, 6])
    anonymous = cache.lookup(None, [4, 5, 7])
    cache.apply(KvCachePolicy.NEW_SESSION)
    cache.store("s2", [4, 5, 6], kv(3), "a", before_new_session)
    cache.store(None, [4, 5, 7], kv(3), "a", anonymous)
    assert cache.describe() == [{"session": "s2", "tokens": 3, "identity": "a", "sealed": True}]
    assert cache.lookup("s3", [4, 5, 6, 8]).reused_tokens == 0


def test_capacity_evicts_the_least_recently_stored() -> None:
    cache = PromptCache(capacity=2)
    for session in ("s1", "s2", "s3"):
        remember(cache, session, [ord(session[-1]), 2, 3])
    assert [entry["session"] for entry in cache.describe()] == ["s2", "s3"]
