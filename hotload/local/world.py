"""Regions for the cross-region demo and benchmarks, in one call: the local regions with a
bucket each behind an emulated WAN link (and replication between the buckets), the chart
installed with helm in each, its operator available.

The address indexes are found the way the tests find theirs: the first base from
``index_base`` on that no other live set of regions holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from hotload.errors import RegionIndexTaken
from hotload.local import chart as hotload_chart
from hotload.local.lifecycle import LocalRegions, up
from hotload.local.region import RegionAddons

log = logging.getLogger(__name__)

#: How many bases to try past the first (each taken by another live run).
BASE_ATTEMPTS: Final = 20
OPERATOR_READY_TIMEOUT_S: Final = 300.0


def bring_up(
    names: Sequence[str],
    *,
    addons: RegionAddons,
    state_dir: Path | None = None,
    index_base: int = 1,
    nodes: int = 2,
    gpus_per_node: int = 8,
    chart: hotload_chart.ChartRelease | None = None,
) -> LocalRegions:
    """The regions up (or found up), the chart installed, its operator available."""
    last = RegionIndexTaken("no free address index", first=index_base, tried=BASE_ATTEMPTS)
    for attempt in range(BASE_ATTEMPTS):
        base = index_base + attempt * len(names)
        try:
            regions = up(
                list(names),
                state_dir=state_dir,
                index_base=base,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                addons=addons,
            )
            break
        except RegionIndexTaken as err:
            log.info("address index taken, trying the next", extra={"index_base": base})
            last = err
    else:
        raise last
    release = hotload_chart.install(regions.regions, chart)
    hotload_chart.wait_operator(regions.regions, release, timeout_s=OPERATOR_READY_TIMEOUT_S)
    return regions
