"""The runtime as one of a region's processes: what ``hotload local up`` starts.

Added to :data:`hotload.local.components.PROCESS_BUILDERS` in the ``WORKLOADS``
wave (once the fake nodes are Ready); ready when its ready file is written (pods and
Services listed, Service ports open). ``down`` sends SIGTERM to it and waits
``stop_timeout_s`` before SIGKILL, so the runtime's own stop (containers within their
capped grace, hosts, ports) fits inside.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from hotload.local.processes import ProcessSpec, Wave
from hotload.local.region import Region
from hotload.local.runtime.settings import RuntimeSettings

PROCESS_NAME: Final = "pod-runtime"
STOP_GRACE_S: Final = 10.0


def settings_for(region: Region, **overrides: object) -> RuntimeSettings:
    """The runtime settings of a region (its admin kubeconfig, its index, its directory)."""
    values: dict[str, object] = {
        "region": region.name,
        "index": region.index,
        "region_dir": region.directory,
        "kubeconfig": region.admin_kubeconfig,
        "context": region.context,
        "stop_grace_s": STOP_GRACE_S,
    }
    values.update(overrides)
    return RuntimeSettings(**values)  # type: ignore[arg-type]


class RuntimeReady:
    """Ready once the runtime wrote its ready file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> bool:
        return self.path.is_file()

    def describe(self) -> str:
        return f"{self.path} written"


def runtime_process(region: Region, tools: Mapping[str, Path]) -> ProcessSpec:
    """``hotload local runtime --region NAME --state-dir DIR`` for ``region``."""
    from hotload.local.runtime.pod_runtime import ready_file

    check = RuntimeReady(ready_file(settings_for(region)))
    executable = Path(sys.executable).parent / "hotload"
    return ProcessSpec(
        name=PROCESS_NAME,
        argv=(
            str(executable),
            "local",
            "runtime",
            "--region",
            region.name,
            "--state-dir",
            str(region.directory.parent),
        ),
        wave=Wave.WORKLOADS,
        ready=check,
        ready_what=check.describe(),
        ready_timeout_s=60.0,
        stop_timeout_s=STOP_GRACE_S + 15.0,
    )
