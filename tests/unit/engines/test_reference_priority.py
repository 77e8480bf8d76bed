"""The delta patch's thread runs below the forward passes' CPU priority when asked."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from hotload.engines.reference.priority import MAX_NICE, patch_pool


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priority is Linux's")
def test_the_patch_thread_alone_is_lowered() -> None:
    here = _nice()
    with patch_pool(5) as pool:
        assert pool.submit(_nice).result() == min(MAX_NICE, here + 5)
    with patch_pool(0) as pool:
        assert pool.submit(_nice).result() == here
    assert _nice() == here, "the caller's thread keeps its priority"
