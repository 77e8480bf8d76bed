"""``hotload engine noop``: the container process of a noop engine serves nothing and
exits cleanly on SIGTERM (what the kubelet — or the local pod runtime — sends)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from hotload.waiting import wait_until


def test_noop_engine_waits_for_sigterm_and_exits_zero() -> None:
    hotload = shutil.which("hotload", path=str(Path(sys.executable).parent)) or "hotload"
    process = subprocess.Popen(
        [hotload, "engine", "noop"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert process.stdout is not None
        stdout = process.stdout

        def said_up() -> bool:  # logged once its signal handlers are in place
            line = stdout.readline()
            assert line or process.poll() is None, f"exited early with {process.returncode}"
            return "serving nothing" in line

        assert wait_until(said_up, 60, interval_s=0), "the noop engine never said it was up"
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
