"""The runtime's record of the process groups it started, so none outlives it.

Every container process (and every shared-mode host) runs as the leader of its own
process group; its pid and kernel start time are written here while it lives. A
runtime that starts after a crash (or ``hotload local down`` after one) kills every
recorded group that is still the same process: no orphan, no port left behind. The
start time guards against a recycled pid. Children also get ``PR_SET_PDEATHSIG``
(see :mod:`hotload.local.runtime.processes`), so a runtime killed with SIGKILL takes
its direct children with it even before anyone reads this ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from hotload.local.runtime.atomic_files import atomic_write_json
from hotload.waiting import wait_until

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] == "Z"


@dataclass(frozen=True)
class LedgerEntry:
    key: str
    pid: int
    ticks: int
    what: str

    def alive(self) -> bool:
        """Still the process we started (same pid, same start time), and not a zombie."""
        return start_ticks(self.pid) == self.ticks and not _is_zombie(self.pid)


class ProcessLedger:
    """One JSON file per live process group under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{_UNSAFE.sub('_', key)}.json"

    def record(self, key: str, pid: int, what: str) -> None:
        ticks = start_ticks(pid)
        if ticks is None:
            return
        atomic_write_json(self._path(key), {"pid": pid, "ticks": ticks, "what": what})

    def forget(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def entries(self) -> list[LedgerEntry]:
        found: list[LedgerEntry] = []
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                found.append(
                    LedgerEntry(path.stem, int(data["pid"]), int(data["ticks"]), str(data["what"]))
                )
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)
        return found

    def reap(self, grace_s: float = 5.0) -> list[LedgerEntry]:
        """Stop every recorded group still alive (SIGTERM, then SIGKILL after ``grace_s``)
        and clear the ledger; returns what was still running. Synchronous on purpose:
        ``down`` calls it without an event loop."""
        alive = [entry for entry in self.entries() if entry.alive()]
        for entry in alive:
            log.warning(
                "stopping an orphaned process group",
                extra={"pid": entry.pid, "what": entry.what},
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry.pid, signal.SIGTERM)
        wait_until(lambda: not any(e.alive() for e in alive), grace_s, interval_s=0.05)
        for entry in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry.pid, signal.SIGKILL)
        for entry in self.entries():
            self.forget(entry.key)
        return alive

    async def reap_async(self, grace_s: float = 5.0) -> list[LedgerEntry]:
        return await asyncio.to_thread(self.reap, grace_s)
