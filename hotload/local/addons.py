"""The optional parts of the local regions, planned and set up in one place for ``up``:
a bucket per region (MinIO) behind an emulated WAN link (toxiproxy), bucket replication
between the regions (MinIO's client ``mc``), and a Prometheus per region.

``up`` asks this module which binaries the add-ons need, which ports to plan, what to
write before anything starts (credentials, configs), what to do once a region's storage
wave is ready (the bucket, the link) and once every region is up (replication).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from hotload.local import object_storage, prometheus, replication, wan
from hotload.local.ports import free_port
from hotload.local.region import Region, RegionAddons

#: Directories of the state (beside the regions) that the add-ons write; ``down`` removes them.
AWS_DIR: Final = "aws"
MC_DIR: Final = "mc"
STATE_DIRS: Final = (AWS_DIR, MC_DIR)


def tools(addons: RegionAddons, regions: int) -> tuple[str, ...]:
    """The cached binaries the add-ons run."""
    needed: list[str] = []
    if addons.object_storage:
        needed += ["minio", "toxiproxy-server"]
        if addons.replication and regions > 1:
            needed.append("mc")
    if addons.prometheus:
        needed.append("prometheus")
    return tuple(needed)


def build_groups(addons: RegionAddons) -> tuple[str, ...]:
    """``hack/build-tools`` groups that build what the regions and these add-ons run."""
    groups = ["control-plane"]
    if addons.object_storage:
        groups += ["minio", "toxiproxy"]
    if addons.prometheus:
        groups.append("prometheus")
    return tuple(groups)


def ports(addons: RegionAddons) -> dict[str, int]:
    """Ports to plan for one region (field names of RegionPorts)."""
    planned: dict[str, int] = {}
    if addons.object_storage:
        planned.update(
            minio=free_port(), minio_console=free_port(), wan=free_port(), wan_api=free_port()
        )
    if addons.prometheus:
        planned["prometheus"] = free_port()
    return planned


def prepare(regions: Sequence[Region], state_dir: Path) -> None:
    """Before anything starts: credentials, the publisher's AWS profiles, Prometheus config."""
    for region in regions:
        if object_storage.enabled(region):
            object_storage.make_credentials(region)
        if prometheus.enabled(region):
            prometheus.write_config(region)
    if any(object_storage.enabled(region) for region in regions):
        object_storage.write_aws_profiles(list(regions), state_dir / AWS_DIR)


def storage_ready(region: Region) -> None:
    """Once the region's storage wave runs: its bucket, and its WAN link opened."""
    if object_storage.enabled(region):
        object_storage.prepare_bucket(region)
        wan.configure(region)


def all_up(regions: Sequence[Region], state_dir: Path) -> None:
    """Once every region runs: bucket replication between them."""
    replication.replicate_mesh(regions, state_dir / MC_DIR)
