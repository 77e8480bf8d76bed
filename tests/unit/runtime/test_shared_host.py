"""The shared host runs each pod's agent as a task with its own registry, and reports."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter

from hotload.local.runtime.shared_host_main import SharedHost
from hotload.local.runtime.shared_protocol import (
    AgentExited,
    AgentStarted,
    Event,
    StartAgent,
    StopAgent,
    decode_command,
    decode_event,
    encode,
)


async def test_agents_run_as_tasks_with_their_own_identity_and_metrics() -> None:
    events: list[Event] = []
    seen: dict[str, str] = {}

    async def agent(env: Mapping[str, str], registry: CollectorRegistry) -> None:
        seen[env["POD_NAME"]] = env["POD_NAME"]
        Counter("hotload_test_swaps_total", "swaps", registry=registry).inc()
        if env["POD_NAME"] == "broken":
            raise RuntimeError("cannot reach the apiserver")
        await asyncio.Event().wait()

    host = SharedHost(agent, events.append)
    for name in ("p-0", "p-1", "broken"):
        host.start(StartAgent(name, f"ns/{name}", {"POD_NAME": name}))
    await asyncio.sleep(0.05)
    assert seen == {"p-0": "p-0", "p-1": "p-1", "broken": "broken"}
    assert len(host) == 2, "the broken agent ended"
    assert host.registries["p-0"] is not host.registries["p-1"]
    assert host.registries["p-0"].get_sample_value("hotload_test_swaps_total") == 1.0
    failed = [e for e in events if isinstance(e, AgentExited)]
    assert failed == [AgentExited("broken", 1, "RuntimeError: cannot reach the apiserver")]
    await host.stop(StopAgent("p-0", 1.0))
    await asyncio.sleep(0)
    assert AgentExited("p-0", 0) in events
    assert sum(isinstance(e, AgentStarted) for e in events) == 3
    await host.stop_all()
    assert len(host) == 0


def test_pipe_messages_round_trip() -> None:
    start = StartAgent("u", "ns/p", {"POD_NAME": "p"})
    assert decode_command(encode(start)) == start
    assert decode_command(encode(StopAgent("u", 2.5))) == StopAgent("u", 2.5)
    assert decode_event(encode(AgentExited("u", 137, "gone"))) == AgentExited("u", 137, "gone")
    assert decode_event(encode(AgentStarted("u"))) == AgentStarted("u")


async def test_every_ended_agent_is_told_to_the_heap_keeper() -> None:
    ended: list[None] = []

    async def agent(env: Mapping[str, str], registry: CollectorRegistry) -> None:
        if env["POD_NAME"] == "broken":
            raise RuntimeError("boom")
        await asyncio.Event().wait()

    host = SharedHost(agent, lambda event: None, on_agent_ended=lambda: ended.append(None))
    for name in ("p-0", "broken"):
        host.start(StartAgent(name, f"ns/{name}", {"POD_NAME": name}))
    async with asyncio.timeout(5):
        while len(ended) < 1:
            await asyncio.sleep(0.01)
    assert len(ended) == 1, "the failed agent, not the running one"
    await host.stop(StopAgent("p-0", 1.0))
    assert len(ended) == 2
