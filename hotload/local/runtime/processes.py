"""Container processes: start one in its own process group, wait for it, stop it.

Each container's command runs as the leader of a new session (so SIGTERM and SIGKILL
reach everything it started), with ``PR_SET_PDEATHSIG`` set to SIGKILL (so it dies
with the runtime even when the runtime is killed outright), its output appended to the
container's log file, and its pid in the runtime's :class:`ProcessLedger` while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from hotload.errors import LocalRegionError
from hotload.local.runtime.process_ledger import ProcessLedger

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG: Final = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the runtime dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def exit_code(returncode: int) -> int:
    """A shell-style exit code: 128 + signal for a process killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class ProcessSpec:
    argv: Sequence[str]
    env: Mapping[str, str] = field(repr=False)
    cwd: Path
    log_path: Path
    ledger_key: str
    what: str
    """A short human description for the ledger and logs (``ns/pod/container``)."""


class LocalProcess:
    """One running container process (the group leader)."""

    def __init__(
        self, process: asyncio.subprocess.Process, spec: ProcessSpec, ledger: ProcessLedger
    ) -> None:
        self._process = process
        self._spec = spec
        self._ledger = ledger
        self.pid = process.pid
        self.started_at = datetime.now(UTC)
        self._started_monotonic = time.monotonic()
        self._exit: asyncio.Task[int] = asyncio.create_task(self._reap())

    async def _reap(self) -> int:
        returncode = await self._process.wait()
        # The leader is gone; end whatever it left in its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._ledger.forget(self._spec.ledger_key)
        code = exit_code(returncode)
        log.info(
            "container process exited",
            extra={"container": self._spec.what, "pid": self.pid, "exit_code": code},
        )
        return code

    @property
    def container_id(self) -> str:
        return f"hotload://{self.pid}"

    @property
    def ran_for_s(self) -> float:
        return time.monotonic() - self._started_monotonic

    async def wait(self) -> int:
        """The exit code once the process ends."""
        return await asyncio.shield(self._exit)

    def signal(self, signum: int) -> None:
        if self._exit.done():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    async def terminate(self, grace_s: float) -> int:
        """SIGTERM the group, wait up to ``grace_s``, then SIGKILL; the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.wait(), timeout=max(grace_s, 0.0))
        except TimeoutError:
            log.warning(
                "container ignored SIGTERM for its grace period; killing",
                extra={"container": self._spec.what, "pid": self.pid, "grace_s": grace_s},
            )
            self.signal(signal.SIGKILL)
            return await self.wait()


async def start_process(spec: ProcessSpec, ledger: ProcessLedger) -> LocalProcess:
    """Start ``spec.argv``; raises ``LocalRegionError`` when it cannot be executed."""
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    spec.cwd.mkdir(parents=True, exist_ok=True)
    with open(spec.log_path, "ab", buffering=0) as log_file:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        log_file.write(f"--- {stamp} starting: {' '.join(spec.argv)}\n".encode())
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv,
                env=dict(spec.env),
                cwd=spec.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except OSError as err:
            raise LocalRegionError(
                "cannot start the container's command",
                container=spec.what,
                command=spec.argv[0] if spec.argv else "",
                error=str(err),
            ) from err
    ledger.record(spec.ledger_key, process.pid, spec.what)
    log.info("container process started", extra={"container": spec.what, "pid": process.pid})
    return LocalProcess(process, spec, ledger)
