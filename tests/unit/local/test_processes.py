"""Detached processes, with real ones: started in their own session, recognised by pid
and start time, stopped with their whole process group even when they ignore SIGTERM."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hotload.errors import LocalRegionError
from hotload.local import processes
from hotload.local.ports import free_port, is_listening
from hotload.local.processes import ProcessRecord, ProcessSpec, Wave


def _spec(
    name: str,
    script: str,
    ready: Callable[[], bool] = lambda: True,
    *,
    wave: Wave = Wave.STORAGE,
    ports: tuple[int, ...] = (),
    ready_timeout_s: float = 10.0,
    stop_timeout_s: float = 5.0,
) -> ProcessSpec:
    return ProcessSpec(
        name=name,
        argv=("/bin/sh", "-c", script),
        wave=wave,
        ready=ready,
        ready_what=f"{name} ready",
        ports=ports,
        ready_timeout_s=ready_timeout_s,
        stop_timeout_s=stop_timeout_s,
    )


def _start_ready(spec: ProcessSpec, tmp_path: Path) -> ProcessRecord:
    record = processes.start(spec, tmp_path / "logs", tmp_path / "pids")
    processes.wait_ready([(spec, record)], region="test")
    return record


def test_started_process_is_recorded_and_alive_until_stopped(tmp_path: Path) -> None:
    record = _start_ready(_spec("sleeper", "exec sleep 300"), tmp_path)
    assert processes.is_alive(record)
    assert processes.read_records(tmp_path / "pids") == [record]
    assert processes.group_members(record.pid) == [record.pid]  # its own session and group

    assert processes.stop([record]) == []
    assert not processes.is_alive(record)


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    record = _start_ready(_spec("sleeper", "exec sleep 300"), tmp_path)
    impostor = record.model_copy(update={"start_ticks": record.start_ticks + 1})
    try:
        assert not processes.is_alive(impostor)
        assert processes.stop([impostor]) == []
        assert processes.is_alive(record), "a pid whose start time differs must not be signalled"
    finally:
        processes.stop([record])


def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    port = free_port()
    server = f"{sys.executable} -m http.server {port} --bind 127.0.0.1"
    # SIGTERM ignored by the shell and, inherited, by its children: only SIGKILL ends them.
    script = f"trap '' TERM; {server} >/dev/null 2>&1 & sleep 300 & wait"
    spec = _spec("stubborn", script, lambda: is_listening(port), ports=(port,), stop_timeout_s=0.5)
    record = _start_ready(spec, tmp_path)
    assert len(processes.group_members(record.pid)) >= 3  # shell, server, sleep

    assert processes.stop([record]) == []
    assert processes.group_members(record.pid) == []
    assert not is_listening(port)


def test_a_process_that_exits_while_starting_fails_with_its_log(tmp_path: Path) -> None:
    spec = _spec("broken", "echo 'flag provided but not defined: -x' >&2; exit 2", lambda: False)
    record = processes.start(spec, tmp_path / "logs", tmp_path / "pids")
    with pytest.raises(LocalRegionError) as failed:
        processes.wait_ready([(spec, record)], region="east")
    assert "flag provided but not defined" in str(failed.value)
    assert failed.value.context["process"] == "broken"


def test_a_process_that_never_gets_ready_times_out(tmp_path: Path) -> None:
    spec = _spec("slow", "exec sleep 300", lambda: False, ready_timeout_s=0.5)
    record = processes.start(spec, tmp_path / "logs", tmp_path / "pids")
    try:
        with pytest.raises(LocalRegionError, match="not ready after"):
            processes.wait_ready([(spec, record)], region="east")
    finally:
        processes.stop([record])


def test_stop_goes_wave_by_wave_last_wave_first(tmp_path: Path) -> None:
    order = tmp_path / "order"

    def waiting(name: str, on_term: str, wave: Wave) -> ProcessSpec:
        marker = tmp_path / f"{name}.trapped"
        script = (
            f"trap '{on_term}echo {name} >> {order}; exit 0' TERM; touch {marker}; sleep 300 & wait"
        )
        return _spec(name, script, marker.exists, wave=wave)

    records = [
        _start_ready(waiting("storage", "", Wave.STORAGE), tmp_path),
        _start_ready(waiting("workloads", "sleep 0.3; ", Wave.WORKLOADS), tmp_path),
    ]
    assert processes.stop(records) == []
    assert order.read_text().split() == ["workloads", "storage"]
