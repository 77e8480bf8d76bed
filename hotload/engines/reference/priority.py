"""A worker thread for the delta patch, below the forward passes' CPU priority.

On a CPU engine the patch (decoding, hashing, the spare's catch-up) and the forward
passes streaming tokens share the same cores. Torch splits each operator of a forward
pass across its intra-op threads, so a forward step runs at the pace of its slowest
thread: one core taken by the patch stretches the gap between two tokens. Lowering the
patch thread's priority (Linux's per-thread nice) lets the forward passes take the
cores when they want them and the patch the rest — the patch takes longer, the pause
shrinks (bench/swap/results.md measures the trade-off).

Only this one thread is lowered, for good: an unprivileged thread cannot raise its
priority back, which is why the patch gets a thread of its own rather than a shared one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

MAX_NICE = 19


def _lower(nice: int) -> None:
    thread = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(MAX_NICE, current + nice))
    except OSError as err:  # a sandbox without setpriority: run at the usual priority
        log.warning("could not lower the patch thread's priority", extra={"error": str(err)})


def patch_pool(nice: int, *, workers: int = 1, name: str = "delta-patch") -> ThreadPoolExecutor:
    """``workers`` threads, ``nice`` steps below the process's priority (Linux; elsewhere,
    where a thread's priority cannot be set alone, or with ``nice`` 0, the usual one)."""
    if nice > 0 and sys.platform == "linux":
        return ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=name, initializer=_lower, initargs=(nice,)
        )
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
