"""The machine's load average while a benchmark runs: every results file says how busy
the (shared) machine was, since every timing on it stretches with the load."""

from __future__ import annotations

import os
import statistics
import threading
from types import TracebackType


class LoadSampler:
    """Samples the 1-minute load average every ``every_s`` seconds in a daemon thread."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        """Median, minimum and maximum of the 1-minute load average over the run so far,
        and the machine's core count (a load above it means waiting for a core)."""
        values = list(self.samples)
        return {
            "load1_median": round(statistics.median(values), 2),
            "load1_min": round(min(values), 2),
            "load1_max": round(max(values), 2),
            "samples": len(values),
            "cpus": float(os.cpu_count() or 0),
        }

    def line(self) -> str:
        s = self.summary()
        return (
            f"load average (1 min) during the run: median {s['load1_median']}, "
            f"min {s['load1_min']}, max {s['load1_max']} on {s['cpus']:.0f} cores"
        )
