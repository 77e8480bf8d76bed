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

from hotload.local import control_plane
from hotload.local.processes import ProcessSpec
from hotload.local.region import Region
from hotload.local.runtime.launcher import runtime_process

ProcessBuilder = Callable[[Region, Mapping[str, Path]], ProcessSpec]
"""(region, cached tool paths by name) → the spec of one process of that region."""

PROCESS_BUILDERS: Final[tuple[ProcessBuilder, ...]] = (
    control_plane.etcd,
    control_plane.apiserver,
    control_plane.controller_manager,
    control_plane.scheduler,
    control_plane.kwok,
    runtime_process,
)


def region_processes(region: Region, tools: Mapping[str, Path]) -> list[ProcessSpec]:
    """The specs of every process of ``region``, in start order."""
    specs = [build(region, tools) for build in PROCESS_BUILDERS]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"process names must be unique in a region: {names}")
    return sorted(specs, key=lambda spec: spec.wave)
