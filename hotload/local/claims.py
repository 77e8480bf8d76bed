"""Which address indexes are taken, machine-wide: a small registry in the shared cache.

Region ``i`` owns 127.i.0.0/16, so two sets of regions (a test run from index 101, a demo
from 1) must never share an index. ``up`` claims its indexes here, and refuses one that a
*live* other state directory holds; a claim is live while the ``up`` that made it runs or
any process of that region's pid files does, so a crashed run never blocks the next one.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from hotload.errors import RegionIndexTaken
from hotload.local import processes
from hotload.local.locations import cache_dir

log = logging.getLogger(__name__)


class Claim(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    region: str
    state_dir: str
    owner_pid: int
    """The ``up`` that made the claim (live while it starts the region)."""
    owner_start_ticks: int


def claims_dir() -> Path:
    return cache_dir() / "claims"


@contextmanager
def _locked() -> Iterator[Path]:
    directory = claims_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _path(directory: Path, index: int) -> Path:
    return directory / f"index-{index}.json"


def _read(path: Path) -> Claim | None:
    try:
        return Claim.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as err:
        log.warning(
            "unreadable index claim, treated as stale", extra={"path": str(path), "error": str(err)}
        )
        return None


def _owner_alive(claim: Claim) -> bool:
    record = processes.ProcessRecord(
        name="up",
        pid=claim.owner_pid,
        start_ticks=claim.owner_start_ticks,
        argv=[],
        ports=[],
        log="",
        wave=0,
        stop_timeout_s=0,
    )
    return processes.is_alive(record)


def is_live(claim: Claim) -> bool:
    """The claim's ``up`` still runs, or some process of its region does."""
    if _owner_alive(claim):
        return True
    pids_dir = Path(claim.state_dir) / claim.region / "pids"
    return any(processes.is_alive(record) for record in processes.read_records(pids_dir))


def claim(indexes: Mapping[int, str], state_dir: Path) -> None:
    """Claim ``index → region name`` for ``state_dir``; :class:`RegionIndexTaken` if held live."""
    owner = os.getpid()
    stat = processes.process_start_ticks(owner)
    with _locked() as directory:
        for index in indexes:
            held = _read(_path(directory, index))
            if held is not None and Path(held.state_dir) != state_dir and is_live(held):
                raise RegionIndexTaken(
                    f"index {index} (127.{index}.0.0/16) is used by live regions in "
                    f"{held.state_dir}: run `hotload local down` there or choose another "
                    "--index-base",
                    index=index,
                    state_dir=held.state_dir,
                )
        for index, region in indexes.items():
            entry = Claim(
                index=index,
                region=region,
                state_dir=str(state_dir),
                owner_pid=owner,
                owner_start_ticks=stat,
            )
            path = _path(directory, index)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(entry.model_dump_json())
            tmp.replace(path)


def release(state_dir: Path) -> list[int]:
    """Drop every claim held by ``state_dir``; return the released indexes."""
    released = []
    with _locked() as directory:
        for path in directory.glob("index-*.json"):
            held = _read(path)
            if held is not None and Path(held.state_dir) == state_dir:
                path.unlink(missing_ok=True)
                released.append(held.index)
    return sorted(released)


def held_by(state_dir: Path) -> list[int]:
    """Indexes currently claimed by ``state_dir``."""
    with _locked() as directory:
        claims = [_read(path) for path in directory.glob("index-*.json")]
    return sorted(c.index for c in claims if c is not None and Path(c.state_dir) == state_dir)
