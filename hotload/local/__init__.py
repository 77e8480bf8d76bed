"""Local regions: a real control plane per region on loopback, with fake GPU nodes.

``up`` / ``down`` / ``status`` are the Python API behind ``hotload local …``; tests,
the demo and the benchmarks use them. The pod runtime (``hotload.local.runtime*``) runs
our containers of pods on the fake nodes; it joins each region's processes through
:data:`hotload.local.components.PROCESS_BUILDERS`.
"""

from hotload.local.lifecycle import LocalRegions, RegionStatus, down, load, status, up
from hotload.local.locations import cache_dir, state_dir
from hotload.local.processes import ProcessSpec, Wave
from hotload.local.region import Region, RegionPorts
from hotload.local.tools import helm_path, kubectl_path, tool_path

__all__ = [
    "LocalRegions",
    "ProcessSpec",
    "Region",
    "RegionPorts",
    "RegionStatus",
    "Wave",
    "cache_dir",
    "down",
    "helm_path",
    "kubectl_path",
    "load",
    "state_dir",
    "status",
    "tool_path",
    "up",
]
