"""Pod addresses from the region's range, and kubelet-like restart backoff."""

from __future__ import annotations

import pytest

from hotload.errors import ConfigError
from hotload.local.runtime.addresses import AddressPool
from hotload.local.runtime.settings import RestartBackoff


def test_addresses_skip_kwoks_first_24_and_are_unique_per_pod() -> None:
    pool = AddressPool(101)
    first, second = pool.allocate("a"), pool.allocate("b")
    assert first == "127.101.1.1"
    assert second == "127.101.1.2"
    assert pool.allocate("a") == first, "a pod keeps its address"
    assert not pool.owns("127.101.0.5"), "kwok's /24 is not ours"
    assert not pool.owns("127.102.1.1"), "another region's range is not ours"


def test_a_released_address_is_reused_and_a_reserved_one_is_kept() -> None:
    pool = AddressPool(7)
    pool.allocate("a")
    pool.release("a")
    assert pool.allocate("b") == "127.7.1.1"
    assert pool.reserve("c", "127.7.3.9")
    assert not pool.reserve("d", "127.7.3.9"), "an address held by another pod is refused"
    assert not pool.reserve("e", "127.7.0.9"), "kwok's share is refused"
    assert pool.allocate("c") == "127.7.3.9"


def test_addresses_never_end_in_0_or_255() -> None:
    pool = AddressPool(3)
    addresses = [pool.allocate(str(n)) for n in range(600)]
    assert all(a.split(".")[3] not in ("0", "255") for a in addresses)
    assert len(set(addresses)) == 600


def test_an_index_outside_the_octet_is_refused() -> None:
    with pytest.raises(ConfigError):
        AddressPool(256)


def test_backoff_restarts_first_at_once_then_doubles_to_the_cap() -> None:
    backoff = RestartBackoff(initial_s=10, maximum_s=300)
    delays = [backoff.delay(n, ran_for_s=1.0) for n in range(1, 9)]
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300]


def test_backoff_starts_over_after_a_long_run() -> None:
    backoff = RestartBackoff(initial_s=10, maximum_s=300, reset_after_s=600)
    assert backoff.delay(6, ran_for_s=601.0) == 0
