"""Containers as real local processes: restarts with backoff, SIGKILL after the grace."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from hotload.local.runtime.container import ContainerProbes, ContainerSupervisor, RunningContainer
from hotload.local.runtime.process_ledger import ProcessLedger, start_ticks
from hotload.local.runtime.processes import ProcessSpec, start_process
from hotload.local.runtime.settings import RestartBackoff
from hotload.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)


def _spec(tmp_path: Path, code: str, key: str = "c") -> ProcessSpec:
    return ProcessSpec(
        argv=[sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path / "root",
        log_path=tmp_path / "logs" / f"{key}.log",
        ledger_key=key,
        what=f"test/{key}",
    )


async def _until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    async def holds() -> bool:
        return predicate()

    if not await wait_until_async(holds, timeout, interval_s=0.05):
        raise AssertionError("condition not met before the deadline")


async def test_a_crashing_container_restarts_with_growing_backoff(tmp_path: Path) -> None:
    ledger = ProcessLedger(tmp_path / "ledger")
    changes: list[int] = []

    async def launch() -> RunningContainer:
        return await start_process(_spec(tmp_path, "import sys; sys.exit(3)"), ledger)

    async with httpx.AsyncClient() as http:
        supervisor = ContainerSupervisor(
            "c",
            "img",
            launch,
            restart_policy="Always",
            backoff=RestartBackoff(initial_s=0.3, maximum_s=0.6),
            probes=ContainerProbes(),
            pod_ip="127.0.0.1",
            http=http,
            kill_grace_s=1.0,
            on_change=lambda: changes.append(supervisor.view().restart_count),
        )
        task = asyncio.create_task(supervisor.run())
        await _until(lambda: supervisor.view().restart_count >= 3)
        view = supervisor.view()
        assert view.last_state["terminated"]["exitCode"] == 3
        assert view.last_state["terminated"]["reason"] == "Error"
        await _until(lambda: "CrashLoopBackOff" in str(supervisor.view().state))
        await supervisor.stop(1.0)
        await asyncio.wait_for(task, 10)
    assert (tmp_path / "logs" / "c.log").read_text().count("starting:") >= 3


async def test_restart_policy_never_leaves_the_container_terminated(tmp_path: Path) -> None:
    ledger = ProcessLedger(tmp_path / "ledger")

    async def launch() -> RunningContainer:
        return await start_process(_spec(tmp_path, "pass"), ledger)

    async with httpx.AsyncClient() as http:
        supervisor = ContainerSupervisor(
            "c",
            "img",
            launch,
            restart_policy="Never",
            backoff=RestartBackoff(),
            probes=ContainerProbes(),
            pod_ip="127.0.0.1",
            http=http,
            kill_grace_s=1.0,
            on_change=lambda: None,
        )
        await asyncio.wait_for(supervisor.run(), 20)
    view = supervisor.view()
    assert view.state["terminated"]["exitCode"] == 0
    assert view.state["terminated"]["reason"] == "Completed"
    assert view.restart_count == 0


async def test_a_process_that_ignores_sigterm_is_killed_after_its_grace(tmp_path: Path) -> None:
    ledger = ProcessLedger(tmp_path / "ledger")
    code = (
        "import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path('armed').touch(); time.sleep(60)"
    )
    process = await start_process(_spec(tmp_path, code), ledger)
    await _until(lambda: (tmp_path / "root" / "armed").exists())
    assert [e.pid for e in ledger.entries()] == [process.pid]
    began = time.monotonic()
    exit_code = await process.terminate(1.0)
    waited = time.monotonic() - began
    assert exit_code == 137
    assert 0.9 <= waited < 5.0
    assert start_ticks(process.pid) is None
    assert ledger.entries() == [], "a stopped process leaves the ledger"


async def test_reaping_the_ledger_stops_groups_a_dead_runtime_left(tmp_path: Path) -> None:
    ledger = ProcessLedger(tmp_path / "ledger")
    orphan = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
    )
    ledger.record("orphan", orphan.pid, "left behind")
    reaped = await ledger.reap_async(grace_s=2.0)
    assert [entry.pid for entry in reaped] == [orphan.pid]
    assert await asyncio.wait_for(orphan.wait(), 5) in (-15, -9)
    assert ledger.entries() == []
