"""Take local regions down when the process that owns them dies.

A test session that is killed (SIGKILL, a CI timeout) never runs its teardown, and its
regions would run on, holding memory and address indexes on a shared machine. The
session starts a reaper beside its regions: a small detached process that waits for the
owner's exit (a pidfd, so no polling where the kernel has them) and then runs ``down``.
A normal teardown runs ``down`` itself and stops the reaper.

    python -m hotload.local.reaper --owner PID --state-dir DIR
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import select
import subprocess
import sys
from pathlib import Path

from hotload.local.processes import process_start_ticks
from hotload.waiting import wait_until

log = logging.getLogger(__name__)


def wait_for_exit(pid: int, start_ticks: int) -> None:
    """Return once process ``pid`` (started at ``start_ticks``) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if process_start_ticks(pid) == start_ticks:
                select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    wait_until(lambda: process_start_ticks(pid) != start_ticks, math.inf, interval_s=1.0)


def start_reaper(state_dir: Path, owner_pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start a detached reaper that runs ``down(state_dir)`` once ``owner_pid`` exits."""
    owner = owner_pid or os.getpid()
    log_path = state_dir / "reaper.log"
    state_dir.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hotload.local.reaper",
                "--owner",
                str(owner),
                "--owner-start-ticks",
                str(process_start_ticks(owner)),
                "--state-dir",
                str(state_dir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--owner-start-ticks", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    from hotload import logs

    logs.configure("INFO", json_lines=True)
    wait_for_exit(args.owner, args.owner_start_ticks)
    from hotload.local.lifecycle import down

    log.warning(
        "owner exited without taking its regions down; taking them down",
        extra={"owner": args.owner, "state_dir": str(args.state_dir)},
    )
    down(args.state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
