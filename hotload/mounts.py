"""Map a container mount path to where it lives on this host.

In a real pod the path is the path. Under the local pod runtime every pod shares one
host, so the runtime makes ``$HOTLOAD_ROOT/<mountPath>`` each volume's folder and sets
``HOTLOAD_ROOT``. Only mount paths go through here: bucket URLs, ``KUBECONFIG`` and other
paths given in env are host paths and are never rewritten (CONTRACTS.md, pod contract).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hotload.errors import ConfigError


def host_path(mount_path: str | PurePosixPath, root: Path | None) -> Path:
    """Where ``mount_path`` (absolute, as in a volumeMount) lives on this host."""
    mount = PurePosixPath(mount_path)
    if not mount.is_absolute():
        raise ConfigError("a mount path must be absolute", mount_path=str(mount_path))
    if ".." in mount.parts:
        raise ConfigError("a mount path may not contain '..'", mount_path=str(mount_path))
    if root is None:
        return Path(mount)
    return Path(root).joinpath(*mount.parts[1:])


def root_from(value: str | None) -> Path | None:
    """The root as given in ``HOTLOAD_ROOT`` (unset or empty: a real pod, no root)."""
    if not value:
        return None
    root = Path(value)
    if not root.is_absolute():
        raise ConfigError("HOTLOAD_ROOT must be an absolute path", value=value)
    return root
