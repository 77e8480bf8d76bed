"""What a model directory holds: safetensors shards, other files, and its kind.

A directory with ``adapter_config.json`` at its top is a LoRA adapter (PEFT layout);
otherwise it is a Hugging Face model directory whose ``*.safetensors`` files are its
shards (a sharded checkpoint keeps its ``*.index.json`` as an ordinary file). Names
starting with ``.`` (caches, lock files) and hotload's own files are not part of it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hotload.errors import ConfigError, ManifestInvalid
from hotload.snapshot.limits import MAX_CONFIG_BYTES, MAX_FILES
from hotload.snapshot.manifest import MANIFEST_NAME
from hotload.snapshot.paths import safe_relpath

ADAPTER_CONFIG: Final = "adapter_config.json"
CONFIG: Final = "config.json"
REBUILT_NAME: Final = "hotload-rebuilt.json"
"""Written by the decoder into a rebuilt directory: which snapshot it holds."""
SHARD_SUFFIX: Final = ".safetensors"
_OWN_FILES: Final = frozenset({MANIFEST_NAME, REBUILT_NAME})


@dataclass(frozen=True)
class ModelDir:
    """A scanned model directory: relative POSIX paths, sorted."""

    root: Path
    shards: tuple[str, ...]
    others: tuple[str, ...]

    @property
    def is_lora(self) -> bool:
        return ADAPTER_CONFIG in self.others

    def path(self, relpath: str) -> Path:
        return self.root / relpath


def scan(root: Path) -> ModelDir:
    """List ``root``'s files (following file symlinks, as in a Hugging Face cache)."""
    if not root.is_dir():
        raise ConfigError("not a directory", path=str(root))
    found: list[str] = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = Path(directory).relative_to(root)
        for name in filenames:
            if name.startswith(".") or (base == Path(".") and name in _OWN_FILES):
                continue
            relpath = (base / name).as_posix()
            safe_relpath(relpath)
            if (root / relpath).is_file():
                found.append(relpath)
        if len(found) > MAX_FILES:
            raise ConfigError("too many files in a model directory", path=str(root))
    found.sort()
    shards = tuple(p for p in found if p.endswith(SHARD_SUFFIX))
    others = tuple(p for p in found if not p.endswith(SHARD_SUFFIX))
    return ModelDir(root, shards, others)


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict (size-capped); :class:`ManifestInvalid` if it is not one."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ManifestInvalid("config.json over its size limit", path=str(path))
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ManifestInvalid("config.json is not JSON", path=str(path)) from err
    if not isinstance(value, dict):
        raise ManifestInvalid("config.json is not a JSON object", path=str(path))
    return value


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> set[str]:
    """Top-level keys added, removed or changed between two configs."""
    return {
        key for key in old.keys() | new.keys() if old.get(key, _ABSENT) != new.get(key, _ABSENT)
    }


def check_config_change(old: Path, new: Path, ignored: tuple[str, ...] | list[str]) -> None:
    """:class:`ManifestInvalid` when ``new`` differs from ``old`` outside ``ignored`` keys."""
    changed = config_changes(read_config(old), read_config(new)) - set(ignored)
    if changed:
        raise ManifestInvalid(
            "config.json changed outside ignoredConfigFields: an incremental snapshot "
            "cannot carry it (publish a Full)",
            keys=sorted(changed)[:20],
        )


class _Absent:
    pass


_ABSENT: Final = _Absent()
