"""The shared host process finishes its agents' work in the order it started them.

A real ``hotload local runtime-host`` process, driven through its pipe as the runtime
drives it, runs more agents than its pool has threads; each agent hands a series of
blocking calls to the pool in turn (as a sidecar's load does). Ranked (the default), the
agents end roughly in the order they were started, the first long before the last — a
replica's load does not wait for the whole fleet's; ``fifo`` (the comparison schedule,
``HOTLOAD_SHARED_HOST_SCHEDULE``) interleaves them and they all end near the end.

Would catch: the host's pool not ranked (every agent ending together), ranks not reaching
the agents' threads, the schedule setting not reaching a host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotload.local.runtime.shared_protocol import AgentExited, StartAgent, decode_event, encode

pytestmark = [pytest.mark.timeout(120)]

#: The checkout: the host imports the test's agent factory from it (CI's venv has the product
#: installed, not the tests, and a console script's path starts at its own directory).
ROOT = Path(__file__).resolve().parents[3]
AGENTS = 24
CALLS = 8
CALL_S = 0.02


def _finish_order(schedule: str, log: Path) -> list[tuple[int, float]]:
    """(start rank, seconds since the host started them) of each agent, in the order they
    ended."""
    env = {
        **os.environ,
        "HOTLOAD_SHARED_HOST_SCHEDULE": schedule,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    argv = [
        str(Path(sys.executable).parent / "hotload"),
        "local", "runtime-host", "--name", f"test-{schedule}",
        "--agent-factory", "tests.integration.runtime.busy_agents:run",
    ]  # fmt: skip
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
    assert process.stdin is not None and process.stdout is not None
    try:
        agent_env = {"BUSY_CALLS": str(CALLS), "BUSY_CALL_S": str(CALL_S)}
        # One write: every agent is started before the host runs the first.
        commands = b"".join(
            encode(StartAgent(f"uid-{rank}", f"ns/p-{rank}", agent_env)) for rank in range(AGENTS)
        )
        process.stdin.write(commands)
        process.stdin.flush()
        ended: list[tuple[int, float]] = []
        began: float | None = None  # the host's first answer: its imports are done
        while len(ended) < AGENTS:
            line = process.stdout.readline()
            if not line:
                process.wait(timeout=30)
                tail = log.read_text(errors="replace")[-4000:]
                raise AssertionError(f"the host exited before its agents ended:\n{tail}")
            event = decode_event(line)
            began = time.monotonic() if began is None else began
            if isinstance(event, AgentExited):
                assert event.code == 0, event
                ended.append((int(event.uid.split("-")[1]), time.monotonic() - began))
        return ended
    finally:
        process.stdin.close()
        process.wait(timeout=30)


def test_ranked_host_ends_agents_in_start_order_fifo_together(tmp_path: Path) -> None:
    ranked = _finish_order("ranked", tmp_path / "ranked.log")
    ranks = [rank for rank, _ in ranked]
    assert sorted(ranks[: AGENTS // 4]) == sorted(ranks)[: AGENTS // 4] or (
        max(ranks[: AGENTS // 4]) < AGENTS // 2
    ), f"the first agents started end first: {ranks}"
    first, last = ranked[0][1], ranked[-1][1]
    assert first < 0.5 * last, f"the first agent ends long before the last: {ranked}"

    fifo = _finish_order("fifo", tmp_path / "fifo.log")
    assert fifo[0][1] > 0.6 * fifo[-1][1], f"a FIFO pool ends every agent near the end: {fifo}"
