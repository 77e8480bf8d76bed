"""Detached processes with pid files: start one from a :class:`ProcessSpec`, tell whether
it still runs, stop it and everything in its process group.

Every process starts in a session of its own (so it outlives ``hotload local up`` and a
signal to its group reaches whatever it started). Its pid file records the kernel's start
time of the process too, so a recycled pid is never mistaken for ours.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import partial
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from hotload.errors import LocalRegionError
from hotload.waiting import wait_until

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], bool]
"""Answers, quickly and without raising, whether a started process serves yet."""


class Wave(IntEnum):
    """Start order of a region's processes; a wave starts when the one before is ready.

    The region's bootstrap (CRDs applied and Established, fake nodes created) runs between
    ``API`` and ``CONTROLLERS``; the nodes turn Ready during ``CONTROLLERS``, and
    ``WORKLOADS`` starts once they are. ``down`` stops waves in reverse order.
    """

    STORAGE = 0
    API = 1
    CONTROLLERS = 2
    WORKLOADS = 3


@dataclass(frozen=True)
class ProcessSpec:
    """One long-running process of a region: what to run and how to know it is ready."""

    name: str
    """Unique in its region; names the pid file and the log (``logs/<name>.log``)."""
    argv: tuple[str, ...]
    wave: Wave
    ready: ReadyCheck
    ready_what: str
    """What ``ready`` checks, for error messages (e.g. ``GET https://127.0.0.1:P/readyz``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to (and overriding) the environment of ``up``."""
    ports: tuple[int, ...] = ()
    """Loopback ports it listens on: ``down`` waits until every one is free."""
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    """How long SIGTERM may take before SIGKILL."""
    cwd: Path | None = None


class ProcessRecord(BaseModel):
    """A started process as its pid file records it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    pid: int
    start_ticks: int
    """Field 22 of /proc/<pid>/stat at start: tells our process from a recycled pid."""
    argv: list[str]
    ports: list[int]
    log: str
    wave: int
    stop_timeout_s: float


@dataclass(frozen=True)
class _ProcStat:
    state: str
    pgrp: int
    start_ticks: int


#: Popen objects of children started by this process, so their exit is reaped.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _stat(pid: int) -> _ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return _ProcStat(state=fields[0], pgrp=int(fields[2]), start_ticks=int(fields[19]))


def process_start_ticks(pid: int) -> int:
    """The kernel's start time of ``pid`` (-1 when it does not exist)."""
    stat = _stat(pid)
    return stat.start_ticks if stat else -1


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)


def is_alive(record: ProcessRecord) -> bool:
    """The recorded process runs (not a zombie, not a recycled pid)."""
    _reap(record.pid)
    stat = _stat(record.pid)
    if stat is None or stat.start_ticks != record.start_ticks:
        return False
    return stat.state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (zombies excluded)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat.pgrp == pgid and stat.state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def pid_file(pids_dir: Path, name: str) -> Path:
    return pids_dir / f"{name}.json"


def read_records(pids_dir: Path) -> list[ProcessRecord]:
    """Every pid file in ``pids_dir`` (malformed ones are logged and skipped)."""
    records: list[ProcessRecord] = []
    if not pids_dir.is_dir():
        return records
    for path in sorted(pids_dir.glob("*.json")):
        try:
            records.append(ProcessRecord.model_validate_json(path.read_text()))
        except (OSError, ValidationError) as err:
            log.warning("unreadable pid file", extra={"path": str(path), "error": str(err)})
    return records


def log_tail(path: Path | str, lines: int = 20) -> str:
    """The last ``lines`` lines of a log, for error messages."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start(spec: ProcessSpec, logs_dir: Path, pids_dir: Path) -> ProcessRecord:
    """Start ``spec`` detached (own session), logging to ``logs/<name>.log``; write its pid file."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    pids_dir.mkdir(parents=True, exist_ok=True)
    log_path = logs_dir / f"{spec.name}.log"
    with log_path.open("wb") as log_file:
        try:
            child = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                close_fds=True,
            )
        except OSError as err:
            raise LocalRegionError(
                "could not start process", process=spec.name, argv0=spec.argv[0]
            ) from err
    _children[child.pid] = child
    record = ProcessRecord(
        name=spec.name,
        pid=child.pid,
        start_ticks=process_start_ticks(child.pid),
        argv=list(spec.argv),
        ports=list(spec.ports),
        log=str(log_path),
        wave=int(spec.wave),
        stop_timeout_s=spec.stop_timeout_s,
    )
    path = pid_file(pids_dir, spec.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.model_dump_json())
    tmp.replace(path)
    log.debug("started", extra={"component": spec.name, "pid": child.pid})
    return record


def wait_ready(started: Sequence[tuple[ProcessSpec, ProcessRecord]], region: str) -> None:
    """Wait until every started process is ready; fail fast when one exits or times out."""
    pending = list(started)
    began = time.monotonic()

    def all_ready() -> bool:
        """Every process ready; raises when one exited or ran past its own timeout."""
        nonlocal pending
        still: list[tuple[ProcessSpec, ProcessRecord]] = []
        for spec, record in pending:
            if not is_alive(record):
                raise LocalRegionError(
                    f"{spec.name} exited while starting; last lines of its log:\n"
                    + log_tail(record.log),
                    region=region,
                    process=spec.name,
                    log=record.log,
                )
            if spec.ready():
                log.info(
                    "ready",
                    extra={
                        "region": region,
                        "component": spec.name,
                        "seconds": round(time.monotonic() - began, 2),
                    },
                )
                continue
            if time.monotonic() - began > spec.ready_timeout_s:
                raise LocalRegionError(
                    f"{spec.name} not ready after {spec.ready_timeout_s:.0f} s "
                    f"({spec.ready_what}); last lines of its log:\n" + log_tail(record.log),
                    region=region,
                    process=spec.name,
                    log=record.log,
                )
            still.append((spec, record))
        pending = still
        return not pending

    # Each process's own timeout raises inside the probe; this bound is only a backstop.
    longest = max((spec.ready_timeout_s for spec, _ in started), default=0.0)
    if not wait_until(all_ready, longest + 1.0, interval_s=0.2):
        raise LocalRegionError(f"not ready: {[spec.name for spec, _ in pending]}", region=region)


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    """Signal the record's process group (its session leader is the recorded pid)."""
    try:
        os.killpg(record.pid, sig)
    except (ProcessLookupError, PermissionError):
        return


def stop(records: Iterable[ProcessRecord]) -> list[str]:
    """Stop ``records`` wave by wave, last wave first: SIGTERM, then SIGKILL after each
    one's grace period; every member of each process group goes too.

    Returns the names of processes that could not be stopped (empty when all are gone).
    """
    by_wave: dict[int, list[ProcessRecord]] = {}
    for record in records:
        by_wave.setdefault(record.wave, []).append(record)
    survivors: list[str] = []
    for wave in sorted(by_wave, reverse=True):
        group = by_wave[wave]
        ours = [record for record in group if _ours_to_signal(record)]
        for record in ours:
            _signal_group(record, signal.SIGTERM)
        grace_s = max((r.stop_timeout_s for r in ours), default=0.0)
        wait_until(partial(_none_running, ours), grace_s, interval_s=0.1)
        for record in ours:
            if _running(record):
                log.warning("killing after grace period", extra={"component": record.name})
                _signal_group(record, signal.SIGKILL)
        wait_until(partial(_none_running, ours), 5.0, interval_s=0.05)
        survivors.extend(r.name for r in ours if _running(r))
    return survivors


def _none_running(records: list[ProcessRecord]) -> bool:
    return not any(_running(record) for record in records)


def _ours_to_signal(record: ProcessRecord) -> bool:
    """The recorded leader still runs, or it is gone (its pid unused) and left group members.

    A pid that another process took since is never signalled: its group may not be ours.
    """
    if is_alive(record):
        return True
    return _stat(record.pid) is None and bool(group_members(record.pid))


def _running(record: ProcessRecord) -> bool:
    """The process or any member of its group still runs."""
    return is_alive(record) or bool(group_members(record.pid))
