"""``hotload engine noop``: the container process of a noop engine serves nothing and
exits cleanly on SIGTERM (what the kubelet — or the local pod runtime — sends)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_noop_engine_waits_for_sigterm_and_exits_zero() -> None:
    hotload = shutil.which("hotload", path=str(Path(sys.executable).parent)) or "hotload"
    process = subprocess.Popen(
        [hotload, "engine", "noop"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while "serving nothing" not in line:  # logged once its signal handlers are in place
            assert time.monotonic() < deadline, "the noop engine never said it was up"
            line = process.stdout.readline()
            assert line or process.poll() is None, f"exited early with {process.returncode}"
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
