"""The runtime's side of the shared mode: one host process per deployment.

Pods annotated ``hotload.dev/runtime: shared`` (a sidecar and a ``noop`` engine) do not
get processes of their own: their agents run as tasks in their deployment's host
(:mod:`hotload.local.runtime.shared_host_main`), which this module starts on demand, talks
to over a pipe, and stops when its last agent stops. To the container supervisor an
agent looks like a process: it starts, it exits with a code, it can be terminated. If
the host dies, each of its agents "exits" with 137 and is restarted by its pod's
policy (which starts a new host).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from hotload.errors import LocalRegionError
from hotload.local.runtime.environment import BASE_ENV_NAMES
from hotload.local.runtime.process_ledger import ProcessLedger
from hotload.local.runtime.processes import die_with_parent, exit_code
from hotload.local.runtime.settings import RuntimeSettings
from hotload.local.runtime.shared_protocol import (
    AgentExited,
    AgentStarted,
    StartAgent,
    StopAgent,
    decode_event,
    encode,
)

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
KILLED = 137


class AgentTask:
    """One pod's agent inside a host, seen as a running container."""

    def __init__(self, host: HostProcess, uid: str) -> None:
        self._host = host
        self.uid = uid
        self._started = time.monotonic()
        self.exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def container_id(self) -> str:
        return f"hotload-agent://{self._host.pid}/{self.uid}"

    @property
    def ran_for_s(self) -> float:
        return time.monotonic() - self._started

    async def wait(self) -> int:
        return await asyncio.shield(self.exit)

    async def terminate(self, grace_s: float) -> int:
        await self._host.send(StopAgent(self.uid, grace_s))
        try:
            return await asyncio.wait_for(self.wait(), timeout=grace_s + 2.0)
        except TimeoutError:
            log.warning("agent did not stop in its grace period", extra={"uid": self.uid})
            self._host.forget(self.uid, KILLED)
            return KILLED


class HostProcess:
    """A running ``hotload local runtime-host`` and its agents."""

    def __init__(
        self, key: str, process: asyncio.subprocess.Process, ledger: ProcessLedger, ledger_key: str
    ) -> None:
        self.key = key
        self.pid = process.pid
        self._process = process
        self._ledger = ledger
        self._ledger_key = ledger_key
        self._agents: dict[str, AgentTask] = {}
        self._started: dict[str, asyncio.Future[None]] = {}
        self._write_lock = asyncio.Lock()
        self.ended = asyncio.get_running_loop().create_task(self._read_events())

    @property
    def alive(self) -> bool:
        return not self.ended.done()

    def __len__(self) -> int:
        return len(self._agents)

    async def send(self, message: StartAgent | StopAgent) -> None:
        stdin = self._process.stdin
        if stdin is None or stdin.is_closing():
            raise LocalRegionError("the shared host is gone", host=self.key)
        async with self._write_lock:
            try:
                stdin.write(encode(message))
                await stdin.drain()
            except (ConnectionError, RuntimeError) as err:
                raise LocalRegionError("the shared host is gone", host=self.key) from err

    async def start_agent(self, uid: str, pod: str, env: Mapping[str, str]) -> AgentTask:
        agent = AgentTask(self, uid)
        self._agents[uid] = agent
        started = asyncio.get_running_loop().create_future()
        self._started[uid] = started
        await self.send(StartAgent(uid, pod, env))
        done, _ = await asyncio.wait(
            {started, self.ended}, timeout=30.0, return_when="FIRST_COMPLETED"
        )
        if started not in done:
            self.forget(uid, KILLED)
            raise LocalRegionError(
                "the shared host did not start the agent", host=self.key, pod=pod
            )
        return agent

    def forget(self, uid: str, code: int) -> None:
        agent = self._agents.pop(uid, None)
        if agent is not None and not agent.exit.done():
            agent.exit.set_result(code)

    async def _read_events(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None
        try:
            while line := await stdout.readline():
                try:
                    event = decode_event(line)
                except LocalRegionError as err:
                    log.warning("ignoring a line from the shared host", extra={"error": str(err)})
                    continue
                if isinstance(event, AgentStarted):
                    future = self._started.pop(event.uid, None)
                    if future is not None and not future.done():
                        future.set_result(None)
                elif isinstance(event, AgentExited):
                    if event.error:
                        log.warning(
                            "shared agent failed", extra={"uid": event.uid, "error": event.error}
                        )
                    self.forget(event.uid, event.code)
        finally:
            code = exit_code(await self._process.wait())
            self._ledger.forget(self._ledger_key)
            log.info("shared host exited", extra={"host": self.key, "exit_code": code})
            for uid in list(self._agents):
                self.forget(uid, KILLED)

    async def close(self, timeout_s: float) -> None:
        """Close its stdin (it cancels every agent and exits); SIGKILL after ``timeout_s``."""
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.ended), timeout=timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            await self.ended


class SharedHosts:
    """Host processes by deployment (``namespace/name``), started on demand."""

    def __init__(self, settings: RuntimeSettings, ledger: ProcessLedger) -> None:
        self._settings = settings
        self._ledger = ledger
        self._hosts: dict[str, HostProcess] = {}
        self._lock = asyncio.Lock()

    def pids(self) -> list[int]:
        return [host.pid for host in self._hosts.values() if host.alive]

    async def _host(self, key: str) -> HostProcess:
        async with self._lock:
            host = self._hosts.get(key)
            if host is not None and host.alive:
                return host
            host = await self._spawn(key)
            self._hosts[key] = host
            return host

    async def _spawn(self, key: str) -> HostProcess:
        settings = self._settings
        safe = _UNSAFE.sub("_", key)
        log_path: Path = settings.hosts_dir / f"{safe}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {
            name: settings.base_env[name] for name in BASE_ENV_NAMES if name in settings.base_env
        }
        env["PYTHONUNBUFFERED"] = "1"
        argv = [
            str(settings.hotload_executable),
            "local",
            "runtime-host",
            "--name",
            key,
            "--agent-factory",
            settings.agent_factory,
        ]
        with open(log_path, "ab", buffering=0) as log_file:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,
                preexec_fn=die_with_parent,
                limit=2**22,
            )
        ledger_key = f"host-{safe}"
        self._ledger.record(ledger_key, process.pid, f"shared host {key}")
        log.info("shared host started", extra={"host": key, "pid": process.pid})
        return HostProcess(key, process, self._ledger, ledger_key)

    async def launch(
        self, deployment: str, uid: str, pod: str, env: Mapping[str, str]
    ) -> AgentTask:
        host = await self._host(deployment)
        agent = await host.start_agent(uid, pod, env)
        agent.exit.add_done_callback(lambda _: self._maybe_close(deployment, host))
        return agent

    def _maybe_close(self, deployment: str, host: HostProcess) -> None:
        """A host whose last agent stopped goes away (no idle processes linger)."""
        if len(host) == 0 and host.alive and self._hosts.get(deployment) is host:
            del self._hosts[deployment]
            asyncio.get_running_loop().create_task(host.close(timeout_s=10.0))

    async def close(self, timeout_s: float = 10.0) -> None:
        hosts = list(self._hosts.values())
        self._hosts.clear()
        await asyncio.gather(*(host.close(timeout_s) for host in hosts), return_exceptions=True)
