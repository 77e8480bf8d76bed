"""The state directory of one set of regions: ``regions.json``, the kubeconfig, and a
directory per region. ``up`` writes ``regions.json`` before it starts anything, so
``down`` and ``status`` can always find what a run (even a crashed one) left behind.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hotload.errors import LocalRegionError
from hotload.local.region import Region

STATE_FILE: Final = "regions.json"
KUBECONFIG_FILE: Final = "kubeconfig"
LOCK_FILE: Final = ".lock"


class StateFile(BaseModel):
    """``regions.json``: every region ``up`` planned, in order."""

    model_config = ConfigDict(frozen=True)

    regions: list[Region]
    created: datetime = Field(default_factory=lambda: datetime.now(UTC))


def kubeconfig_path(state_dir: Path) -> Path:
    return state_dir / KUBECONFIG_FILE


def read_state(state_dir: Path) -> StateFile | None:
    path = state_dir / STATE_FILE
    try:
        return StateFile.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as err:
        raise LocalRegionError(
            "regions.json is unreadable; run `hotload local down` to clean up",
            path=str(path),
            error=str(err)[:300],
        ) from err


def write_state(state_dir: Path, state: StateFile) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(path)


def write_json_atomically(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """One ``up``/``down`` at a time per state directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
