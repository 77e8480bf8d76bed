"""Region names, indexes and address ranges."""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path

import pytest

from hotload.errors import ConfigError
from hotload.local.region import (
    Region,
    RegionPorts,
    default_names,
    validate_index,
    validate_name,
)


def _region(index: int) -> Region:
    return Region(
        name="east",
        index=index,
        directory=Path("/state/east"),
        kubeconfig=Path("/state/kubeconfig"),
        ports=RegionPorts(
            etcd_client=1, etcd_peer=2, apiserver=3, controller_manager=4, scheduler=5, kwok=6
        ),
        nodes=2,
        gpus_per_node=8,
    )


def test_default_names_count_from_one() -> None:
    assert default_names(3) == ["region-1", "region-2", "region-3"]
    with pytest.raises(ConfigError):
        default_names(0)


@pytest.mark.parametrize("name", ["Region", "1east", "east_1", "a" * 41, "east-", ""])
def test_names_that_cannot_be_contexts_and_labels_are_refused(name: str) -> None:
    with pytest.raises(ConfigError):
        validate_name(name)


@pytest.mark.parametrize("index", [0, 256, -1])
def test_indexes_outside_the_second_octet_are_refused(index: int) -> None:
    with pytest.raises(ConfigError):
        validate_index(index)


def test_region_owns_its_slash_16_and_kwok_gets_the_first_24() -> None:
    region = _region(101)
    assert str(region.pod_network) == "127.101.0.0/16"
    assert str(region.kwok_network) == "127.101.0.0/24"
    assert region.kwok_network.subnet_of(region.pod_network)
    assert IPv4Address("127.101.1.5") not in region.kwok_network
    assert IPv4Address("127.102.0.5") not in region.pod_network
    assert not region.pod_network.overlaps(_region(102).pod_network)


def test_region_paths_and_addresses() -> None:
    region = _region(7)
    assert region.context == "east"
    assert region.apiserver_url == "https://127.0.0.1:3"
    assert region.services_file == Path("/state/east/services.json")
    assert region.admin_kubeconfig == Path("/state/east/admin.kubeconfig")
    assert region.node_names() == ["east-gpu-0", "east-gpu-1"]
    assert set(region.ports.all()) == {1, 2, 3, 4, 5, 6}
    assert Region.model_validate_json(region.model_dump_json()) == region
