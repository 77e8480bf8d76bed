"""The shared-mode host: many pods' agents as asyncio tasks in one process.

``hotload local runtime-host`` runs one per deployment (started by the runtime, never by
hand). For each ``start`` on stdin it runs the agent factory with that pod's
environment and a fresh prometheus ``CollectorRegistry``: each agent has its own
identity, its own pod-bound token (its ``KUBECONFIG``) and its own metrics, as in its
own pod. ``stop`` cancels the agent's task; when stdin closes (the runtime went away)
every agent is cancelled and the host exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import itertools
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from hotload.errors import ConfigError
from hotload.local.runtime.heap_keeper import HeapKeeper
from hotload.local.runtime.ranked_executor import AGENT_RANK, RankedExecutor
from hotload.local.runtime.ranked_slots import RankedSlots
from hotload.local.runtime.shared_protocol import (
    AgentExited,
    AgentStarted,
    Event,
    StartAgent,
    StopAgent,
    decode_command,
    encode,
)
from hotload.local.runtime.urgent_loop import Urgency, UrgentFirstLoop, urgent_first_runner
from hotload.sidecar.build_slots import BUILD_SLOTS, BuildSlots

log = logging.getLogger(__name__)

AgentFactory = Callable[[Mapping[str, str], CollectorRegistry], Coroutine[Any, Any, None]]
"""Runs one pod's agent until cancelled: (the pod's container env, its registry)."""


def load_factory(path: str) -> AgentFactory:
    """``module:function`` → the function."""
    module_name, _, attribute = path.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ConfigError("cannot load the agent factory", factory=path) from err
    if not callable(factory):
        raise ConfigError("the agent factory is not callable", factory=path)
    return factory  # type: ignore[no-any-return]


class SharedHost:
    """The agents of one host process, by pod uid."""

    def __init__(
        self,
        factory: AgentFactory,
        emit: Callable[[Event], None],
        slots: BuildSlots | None = None,
        on_agent_ended: Callable[[], None] | None = None,
    ) -> None:
        self._factory = factory
        self._emit = emit
        self._slots = slots
        """Turns to build, shared by this host's agents (None: every agent builds at once)."""
        self._on_agent_ended = on_agent_ended
        """Told of every agent whose task ended (the heap keeper reclaims its objects)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.registries: dict[str, CollectorRegistry] = {}
        self._ranks = itertools.count()

    def start(self, command: StartAgent) -> None:
        if command.uid in self._tasks and not self._tasks[command.uid].done():
            self._emit(AgentStarted(command.uid))
            return
        registry = CollectorRegistry(auto_describe=True)
        self.registries[command.uid] = registry
        context = contextvars.copy_context()  # the agent's tasks inherit its rank
        context.run(AGENT_RANK.set, next(self._ranks))
        context.run(BUILD_SLOTS.set, self._slots)
        task = asyncio.create_task(
            self._factory(command.env, registry), name=command.pod, context=context
        )
        self._tasks[command.uid] = task
        task.add_done_callback(lambda done: self._ended(command.uid, command.pod, done))
        self._emit(AgentStarted(command.uid))
        log.info("agent started", extra={"pod": command.pod, "agents": len(self._tasks)})

    def _ended(self, uid: str, pod: str, task: asyncio.Task[None]) -> None:
        if self._on_agent_ended is not None:
            self._on_agent_ended()
        if self._tasks.get(uid) is task:
            del self._tasks[uid]
            self.registries.pop(uid, None)
        if task.cancelled():
            self._emit(AgentExited(uid, 0))
            return
        error = task.exception()
        if error is None:
            self._emit(AgentExited(uid, 0))
        else:
            log.error(
                "agent failed",
                extra={"pod": pod, "error": f"{type(error).__name__}: {error}"},
                exc_info=error,
            )
            self._emit(AgentExited(uid, 1, f"{type(error).__name__}: {error}"))

    async def stop(self, command: StopAgent) -> None:
        task = self._tasks.get(command.uid)
        if task is None:
            self._emit(AgentExited(command.uid, 0))
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), timeout=max(command.grace_s, 0.1))

    async def stop_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)


#: How the host's thread pool orders the agents' blocking calls: ``ranked`` (the agent
#: started first goes first: :mod:`~hotload.local.runtime.ranked_executor`) or ``fifo``.
SCHEDULES = ("ranked", "fifo")
#: ``ranked``: agents building at once per core of the host (:mod:`~hotload.sidecar.build_slots`).
#: A build alternates between the event loop and a pool thread, so two per core keep both
#: busy; more only lengthen each turn of the loop. ``fifo`` lets every agent build at once.
BUILDS_PER_CORE = 2


def run_host(factory: AgentFactory, schedule: str = "ranked") -> None:
    """Serve until stdin closes, on the loop :func:`host_runner` picks."""
    runner, urgency = host_runner(schedule)
    with runner:
        runner.run(serve(factory, schedule, urgency))


def host_runner(schedule: str) -> tuple[asyncio.Runner, Urgency | None]:
    """``ranked``: a loop that runs building agents first
    (:mod:`~hotload.local.runtime.urgent_loop`) and its urgency; ``fifo``, or a Python
    whose event loop lacks the urgent lane's hooks: a plain loop."""
    if schedule not in SCHEDULES:
        raise ConfigError("unknown shared host schedule", schedule=schedule)
    if schedule == "fifo":
        return asyncio.Runner(), None
    if not UrgentFirstLoop.supported():
        log.warning(
            "this Python's event loop lacks the hooks of the urgent lane: a plain loop",
            extra={"python": sys.version.split()[0]},
        )
        return asyncio.Runner(), None
    urgency = Urgency(first_ranks=build_slots())
    return urgent_first_runner(urgency), urgency


def build_slots() -> int:
    """Turns to build of a ``ranked`` host: :data:`BUILDS_PER_CORE` per core."""
    return BUILDS_PER_CORE * (os.cpu_count() or 1)


async def serve(
    factory: AgentFactory, schedule: str = "ranked", urgency: Urgency | None = None
) -> None:
    """Read commands from stdin, write events to stdout, until stdin closes.

    ``urgency``: the running loop's (:func:`run_host`), told which agents hold a turn."""
    loop = asyncio.get_running_loop()
    if schedule not in SCHEDULES:
        raise ConfigError("unknown shared host schedule", schedule=schedule)
    slots = None
    if schedule == "ranked":
        cores = os.cpu_count() or 1
        loop.set_default_executor(RankedExecutor(min(32, cores + 4), "agents", urgency))
        slots = RankedSlots(build_slots(), urgency)
    reader = asyncio.StreamReader(limit=2**22)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer

    def emit(event: Event) -> None:
        out.write(encode(event))
        out.flush()

    heap = HeapKeeper()
    keeping = loop.create_task(heap.run(), name="heap-keeper")
    host = SharedHost(factory, emit, slots, on_agent_ended=heap.agent_stopped)
    stopping: set[asyncio.Task[None]] = set()
    try:
        while line := await reader.readline():
            command = decode_command(line)
            if isinstance(command, StartAgent):
                host.start(command)
            else:
                task = loop.create_task(host.stop(command))
                stopping.add(task)
                task.add_done_callback(stopping.discard)
    finally:
        await host.stop_all()
        keeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
