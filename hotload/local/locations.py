"""Where the local regions keep their things: a shared cache and a per-run state directory.

Both live outside any clone. The cache (``$HOTLOAD_CACHE``, default ``~/.cache/hotload``)
holds the built binaries and the index claims and is shared by every run on the machine;
the state (``$HOTLOAD_STATE``, default ``~/.local/state/hotload``) holds one set of
regions: their kubeconfig, etcd data, certificates, logs and pid files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

CACHE_ENV: Final = "HOTLOAD_CACHE"
STATE_ENV: Final = "HOTLOAD_STATE"


def cache_dir() -> Path:
    """The shared cache: ``$HOTLOAD_CACHE`` or ``~/.cache/hotload``."""
    value = os.environ.get(CACHE_ENV)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "hotload"


def state_dir() -> Path:
    """The default state directory: ``$HOTLOAD_STATE`` or ``~/.local/state/hotload``."""
    value = os.environ.get(STATE_ENV)
    return Path(value).expanduser() if value else Path.home() / ".local" / "state" / "hotload"
