"""The real sidecar agent, with a stack sampler in its shared host (profiling only).

``bench/propagation/run.py --agent sampled`` selects it
(``HOTLOAD_RUNTIME_AGENT_FACTORY=bench.propagation.sampled_agent:run``). The first agent a
host starts also starts a daemon thread that samples every thread's Python stack
(``sys._current_frames``) every few milliseconds and, every few seconds, writes what it
saw to ``<dir>/host-<pid>.json``: for each function, how many samples had it on top of a
busy thread (self) and anywhere on a busy thread's stack (inclusive). A thread counts as
idle while its top frame is the event loop's ``select`` or a pool worker's wait for
work. Wall-clock samples, all threads: unlike cProfile it sees the decode threads, and it
costs the host a few percent, not double.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from hotload.local.runtime.agent_factory import run_sidecar_agent

SAMPLES_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "hotload-host-samples"
INTERVAL_S = 0.005
WRITE_EVERY_S = 5.0
_IDLE_TOPS = {
    ("selectors.py", "select"),
    ("thread.py", "_worker"),
    ("threading.py", "wait"),
    ("queue.py", "get"),
}
_started = False


def _where(frame: FrameType) -> tuple[str, str]:
    code = frame.f_code
    return os.path.basename(code.co_filename), code.co_name


def _label(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("/hotload/", "/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{code.co_firstlineno}({code.co_name})"


class Sampler:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.busy: Counter[str] = Counter()
        self.inclusive: Counter[str] = Counter()
        self.samples = 0
        self.busy_samples = 0
        self.started = time.time()

    def sample(self) -> None:
        me = threading.get_ident()
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            self.samples += 1
            if _where(frame) in _IDLE_TOPS:
                continue
            self.busy_samples += 1
            self.busy[_label(frame)] += 1
            seen: set[str] = set()
            walk: FrameType | None = frame
            while walk is not None:
                label = _label(walk)
                if label not in seen:
                    seen.add(label)
                    self.inclusive[label] += 1
                walk = walk.f_back

    def write(self) -> None:
        document = {
            "pid": os.getpid(),
            "interval_s": INTERVAL_S,
            "seconds": round(time.time() - self.started, 1),
            "samples": self.samples,
            "busy_samples": self.busy_samples,
            "self": self.busy.most_common(80),
            "inclusive": self.inclusive.most_common(200),
        }
        temp = self.out.with_suffix(".tmp")
        temp.write_text(json.dumps(document, indent=1))
        temp.replace(self.out)

    def run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(INTERVAL_S)
            self.sample()
            if time.monotonic() - last > WRITE_EVERY_S:
                last = time.monotonic()
                self.write()


def _start_sampler() -> None:
    global _started
    if _started:
        return
    _started = True
    SAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(SAMPLES_DIR / f"host-{os.getpid()}.json")
    threading.Thread(target=sampler.run, name="stack-sampler", daemon=True).start()


async def run(env: Mapping[str, str], registry: CollectorRegistry) -> None:
    """The real agent (unchanged), after starting this host's sampler once."""
    _start_sampler()
    await run_sidecar_agent(env, registry)
