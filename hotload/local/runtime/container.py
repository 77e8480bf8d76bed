"""One container's life: start, probe, restart with backoff, stop.

The supervisor is the same for every way a container runs (a local process, an agent
task in a shared host, the noop engine that lives inside its agent): it gets a
``launch`` coroutine and turns what happens into the fields of a ``containerStatus``
(state, lastState, ready, started, restartCount). ``restartPolicy`` is honoured with
kubelet-like backoff; a failed liveness or startup probe kills the container so the
policy restarts it. Every change calls ``on_change`` (the pod's status writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from hotload.api.conditions import rfc3339
from hotload.errors import ContainerConfigInvalid, HotloadError
from hotload.local.runtime.probes import ProbeLoop, ProbeSpec
from hotload.local.runtime.settings import RestartBackoff

log = logging.getLogger(__name__)


class RunningContainer(Protocol):
    """What a launch returns: something that ends with an exit code and can be stopped."""

    @property
    def container_id(self) -> str: ...

    @property
    def ran_for_s(self) -> float: ...

    async def wait(self) -> int: ...

    async def terminate(self, grace_s: float) -> int: ...


Launch = Callable[[], Awaitable[RunningContainer]]


@dataclass(frozen=True)
class ContainerProbes:
    readiness: ProbeSpec | None = None
    liveness: ProbeSpec | None = None
    startup: ProbeSpec | None = None


@dataclass(frozen=True)
class ContainerView:
    """A container's status as the runtime reports it (``status.containerStatuses[]``)."""

    name: str
    image: str
    state: dict[str, Any]
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    container_id: str = ""
    running: bool = False
    ever_ran: bool = False
    terminated_code: int | None = None

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def waiting_view(name: str, image: str, reason: str, message: str) -> ContainerView:
    """A container that never runs (its command is not ours)."""
    return ContainerView(name, image, {"waiting": {"reason": reason, "message": message}})


def _now() -> str:
    return rfc3339(datetime.now(UTC))


class ContainerSupervisor:
    def __init__(
        self,
        name: str,
        image: str,
        launch: Launch,
        *,
        restart_policy: str,
        backoff: RestartBackoff,
        probes: ContainerProbes,
        pod_ip: str,
        http: httpx.AsyncClient,
        kill_grace_s: float,
        on_change: Callable[[], None],
        restart_count: int = 0,
        last_state: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.image = image
        self._launch = launch
        self._policy = restart_policy
        self._backoff = backoff
        self._probes = probes
        self._pod_ip = pod_ip
        self._http = http
        self._kill_grace_s = kill_grace_s
        self._on_change = on_change
        self._stop = asyncio.Event()
        self._running: RunningContainer | None = None
        self._probe_tasks: list[asyncio.Task[None]] = []
        self._view = ContainerView(
            name,
            image,
            {"waiting": {"reason": "ContainerCreating"}},
            last_state=last_state or {},
            restart_count=restart_count,
        )

    # --- observed state ----------------------------------------------------------------

    def view(self) -> ContainerView:
        return self._view

    def _set(self, **changes: Any) -> None:
        values = {**self._view.__dict__, **changes}
        self._view = ContainerView(**values)
        self._on_change()

    # --- life --------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the container until it ends for good (policy) or :meth:`stop` is called."""
        config_failures = 0
        while not self._stop.is_set():
            try:
                running = await self._launch()
            except ContainerConfigInvalid as err:
                config_failures += 1
                self._set(state={"waiting": {"reason": err.reason, "message": str(err)}})
                await self._pause(self._backoff.delay(config_failures + 1, 0.0) or 1.0)
                continue
            except HotloadError as err:
                config_failures += 1
                self._set(state={"waiting": {"reason": "RunContainerError", "message": str(err)}})
                await self._pause(self._backoff.delay(config_failures + 1, 0.0) or 1.0)
                continue
            config_failures = 0
            self._running = running
            started_at = _now()
            self._set(
                state={"running": {"startedAt": started_at}},
                container_id=running.container_id,
                running=True,
                ever_ran=True,
                started=self._probes.startup is None,
                ready=self._probes.readiness is None and self._probes.startup is None,
                terminated_code=None,
            )
            self._start_probes(running)
            code = await running.wait()
            self._stop_probes()
            self._running = None
            terminated = {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started_at,
                    "finishedAt": _now(),
                    "containerID": running.container_id,
                }
            }
            restart = not self._stop.is_set() and (
                self._policy == "Always" or (self._policy == "OnFailure" and code != 0)
            )
            if not restart:
                self._set(
                    state=terminated,
                    ready=False,
                    started=False,
                    running=False,
                    terminated_code=code,
                )
                return
            count = self._view.restart_count + 1
            delay = self._backoff.delay(count, running.ran_for_s)
            log.info(
                "restarting container",
                extra={
                    "container": self.name,
                    "exit_code": code,
                    "delay_s": delay,
                    "restart": count,
                },
            )
            self._set(
                state={
                    "waiting": {
                        "reason": "CrashLoopBackOff" if delay else "ContainerCreating",
                        "message": f"back-off {delay:g}s restarting failed container={self.name}"
                        if delay
                        else "",
                    }
                },
                last_state=terminated,
                restart_count=count,
                ready=False,
                started=False,
                running=False,
                terminated_code=code,
            )
            await self._pause(delay)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def stop(self, grace_s: float) -> None:
        """No more restarts; SIGTERM (or its equivalent), SIGKILL after ``grace_s``."""
        self._stop.set()
        running = self._running
        if running is not None:
            await running.terminate(grace_s)

    # --- probes ------------------------------------------------------------------------

    def _start_probes(self, running: RunningContainer) -> None:
        startup = self._probes.startup
        if startup is not None:
            self._spawn_probe(
                startup,
                initial=None,
                on_change=self._startup_changed(running),
                stop_on_success=True,
            )
        else:
            self._start_steady_probes(running)

    def _start_steady_probes(self, running: RunningContainer) -> None:
        if self._probes.readiness is not None:
            self._spawn_probe(self._probes.readiness, initial=False, on_change=self._ready_changed)
        if self._probes.liveness is not None:
            self._spawn_probe(
                self._probes.liveness,
                initial=True,
                on_change=self._kill_on_failure(running, "Liveness"),
            )

    def _spawn_probe(
        self,
        spec: ProbeSpec,
        *,
        initial: bool | None,
        on_change: Callable[[bool, str], Awaitable[None] | None],
        stop_on_success: bool = False,
    ) -> None:
        loop = ProbeLoop(
            spec,
            self._pod_ip,
            self._http,
            on_change,
            initial=initial,
            stop_on_success=stop_on_success,
        )
        self._probe_tasks.append(asyncio.create_task(loop.run()))

    def _stop_probes(self) -> None:
        for task in self._probe_tasks:
            task.cancel()
        self._probe_tasks = []

    def _ready_changed(self, ok: bool, message: str) -> None:
        log.info("readiness changed", extra={"container": self.name, "ready": ok, "probe": message})
        self._set(ready=ok)

    def _startup_changed(
        self, running: RunningContainer
    ) -> Callable[[bool, str], Awaitable[None] | None]:
        def changed(ok: bool, message: str) -> Awaitable[None] | None:
            if ok:
                self._set(started=True, ready=self._probes.readiness is None)
                self._start_steady_probes(running)
                return None
            return self._kill(running, "Startup", message)

        return changed

    def _kill_on_failure(
        self, running: RunningContainer, which: str
    ) -> Callable[[bool, str], Awaitable[None] | None]:
        def changed(ok: bool, message: str) -> Awaitable[None] | None:
            return None if ok else self._kill(running, which, message)

        return changed

    async def _kill(self, running: RunningContainer, which: str, message: str) -> None:
        log.warning(
            f"{which.lower()} probe failed; restarting the container",
            extra={"container": self.name, "probe": message},
        )
        # Terminate from a task of its own: this callback runs inside a probe task that
        # the exit path cancels.
        asyncio.get_running_loop().create_task(running.terminate(self._kill_grace_s))
