"""The pinned binaries in the cache (``bin/NAME-VERSION``), and how to get them built.

Never the machine's own ``kubectl`` (too old for a 1.35 apiserver): every caller goes
through :func:`tool_path`. A missing binary is :class:`~hotload.errors.ToolMissing`
naming the build script; :func:`build_tools` runs that script when the package runs
from a checkout (it is idempotent and never rebuilds what is cached).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from hotload.errors import ToolMissing
from hotload.local.locations import cache_dir
from hotload.local.versions import repo_root, tool_version

log = logging.getLogger(__name__)

#: What ``hotload local up`` runs in every region (kubectl is used to talk to them).
CONTROL_PLANE_TOOLS: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
)


def bin_dir() -> Path:
    return cache_dir() / "bin"


def expected_path(name: str) -> Path:
    """Where the pinned binary ``name`` lives in the cache, whether or not it is there."""
    return bin_dir() / f"{name}-{tool_version(name)}"


def build_script() -> Path | None:
    """``hack/build-tools`` of the checkout this package runs from, if any."""
    root = repo_root()
    if root is None:
        return None
    script = root / "hack" / "build-tools"
    return script if script.is_file() else None


def tool_path(name: str) -> Path:
    """The cached binary ``name`` at its pinned version; :class:`ToolMissing` if absent."""
    path = expected_path(name)
    if path.is_file() and os.access(path, os.X_OK):
        return path
    script = build_script()
    hint = str(script) if script else "hack/build-tools (from a hotload checkout)"
    raise ToolMissing(
        f"{name} is not built yet: run {hint} (cold builds take about 20 minutes; "
        "later runs reuse the cache)",
        tool=name,
        expected=str(path),
    )


def missing_tools(names: Iterable[str] = CONTROL_PLANE_TOOLS) -> list[str]:
    """The tools among ``names`` that are not in the cache."""
    return [name for name in names if not expected_path(name).is_file()]


def require_tools(names: Iterable[str] = CONTROL_PLANE_TOOLS) -> dict[str, Path]:
    """Every tool in ``names`` by path, or :class:`ToolMissing` for the first absent one."""
    return {name: tool_path(name) for name in names}


def build_tools(groups: Iterable[str] = ("control-plane",)) -> None:
    """Run ``hack/build-tools`` (needs a checkout and Go); it skips what is already built."""
    script = build_script()
    if script is None:
        raise ToolMissing(
            "binaries are missing and no hack/build-tools is reachable from this install",
            cache=str(bin_dir()),
        )
    log.info("building pinned tools", extra={"script": str(script), "groups": list(groups)})
    env = {**os.environ, "HOTLOAD_CACHE": str(cache_dir())}
    result = subprocess.run([str(script), *groups], env=env, check=False)
    if result.returncode != 0:
        raise ToolMissing(
            "hack/build-tools failed; see its output above",
            script=str(script),
            returncode=result.returncode,
        )


def kubectl_path() -> Path:
    """The pinned kubectl (never ``/usr/bin/kubectl``: too old for the apiserver)."""
    return tool_path("kubectl")


def helm_path() -> Path:
    return tool_path("helm")


def kwok_path() -> Path:
    return tool_path("kwok")


def etcd_path() -> Path:
    return tool_path("etcd")


def minio_path() -> Path:
    return tool_path("minio")


def toxiproxy_path() -> Path:
    return tool_path("toxiproxy-server")
