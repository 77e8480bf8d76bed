"""Every long-running process of a region, in one list: the extension point of ``up``.

``up`` starts these wave by wave (see :class:`~hotload.local.processes.Wave`) and
``down`` stops them in reverse; status reports each by name. A part that needs a process
per region (the pod runtime: ``hotload local runtime --region NAME``) adds its
:class:`~hotload.local.processes.ProcessSpec` builder to :data:`PROCESS_BUILDERS` here,
with the wave it needs (``Wave.WORKLOADS`` starts once the fake nodes are Ready).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from hotload.local import control_plane, object_storage, prometheus, wan
from hotload.local.addons import tools as addon_tools
from hotload.local.processes import ProcessSpec
from hotload.local.region import Region
from hotload.local.runtime.launcher import runtime_process
from hotload.local.tools import CONTROL_PLANE_TOOLS, require_tools

ProcessBuilder = Callable[[Region, Mapping[str, Path]], ProcessSpec | None]
"""(region, cached tool paths by name) → the spec of one process of that region (None: an
add-on the region does not have)."""

PROCESS_BUILDERS: Final[tuple[ProcessBuilder, ...]] = (
    control_plane.etcd,
    control_plane.apiserver,
    control_plane.controller_manager,
    control_plane.scheduler,
    control_plane.kwok,
    runtime_process,
    object_storage.minio_process,
    wan.wan_process,
    prometheus.prometheus_process,
)


def region_tools(region: Region) -> dict[str, Path]:
    """Every cached binary the region's processes run (its add-ons' included)."""
    return require_tools((*CONTROL_PLANE_TOOLS, *addon_tools(region.addons, regions=1)))


def region_processes(region: Region, tools: Mapping[str, Path]) -> list[ProcessSpec]:
    """The specs of every process of ``region``, in start order."""
    specs = [spec for build in PROCESS_BUILDERS if (spec := build(region, tools)) is not None]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"process names must be unique in a region: {names}")
    return sorted(specs, key=lambda spec: spec.wave)
