"""The handover's order around an engine without rollback (hotload.sidecar.handover).

Measured on a real vLLM (tests/integration/engines/test_vllm_real.py): after a failed
reload its weights are half-loaded and the next request kills it, and the first reload
after a refused one may fail too. So: the load is confirmed before held requests
resume, and a failed load is undone by reloading the served buffer, up to twice, before
they resume. The engine here records the order of calls; nothing else is faked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind, Transition
from hotload.engines.protocol import EngineReport, PauseMode
from hotload.errors import EngineRejected, LoadNotStarted
from hotload.sidecar.handover import Handover, HandoverFailed
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import Slot, Staged
from hotload.sidecar.staging import StagingArea
from hotload.sidecar.swap_gate import GateState, SwapGate


class Recording:
    """An engine with no rollback that refuses the loads it is told to."""

    rollback_trusted = False
    kind = EngineKind.VLLM
    base_url = "http://engine"

    def __init__(self, refuse: list[BaseException | None]) -> None:
        self.calls: list[str] = []
        self.serving: str | None = "good"
        self._refuse = refuse

    async def pause(self, mode: PauseMode, *, cache_policy: KvCachePolicy | None = None) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def load_weights(self, path: Path, identity: str, *, kind: SnapshotKind) -> None:
        self.calls.append(f"load {identity}")
        error = self._refuse.pop(0) if self._refuse else None
        if error is not None:
            self.serving = None
            raise error
        self.serving = identity

    async def report(self, *, digest: bool = False) -> EngineReport:
        self.calls.append("report")
        return EngineReport(self.serving, "1", None)

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        self.calls.append("reset")

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        return []


GOOD = Staged("good", 1, SnapshotKind.FULL, None)
NEW = Staged("new", 2, SnapshotKind.FULL, None)


async def hand(
    engine: Recording,
    tmp_path: Path,
    staged: Staged = NEW,
    gate: SwapGate | None = None,
    drain_timeout_s: float = 1,
) -> None:
    staging = StagingArea(tmp_path)
    staging.prepare()
    metrics = AgentMetrics(CollectorRegistry())
    gate = gate or SwapGate(metrics, hold_timeout_s=5, retry_after_s=1)
    handover = Handover(engine, staging, gate, metrics, drain_timeout_s=drain_timeout_s)
    engine.calls.append("start")
    await handover.hand(
        Slot.B,
        staged,
        served=Slot.A,
        transition=Transition.ASYNC,
        cache_policy=None,
        on_swapping=lambda: None,
        recovery=GOOD,
        on_confirmed=lambda report: engine.calls.append(f"confirmed {report.identity}"),
    )


async def test_the_load_is_confirmed_before_held_requests_resume(tmp_path: Path) -> None:
    engine = Recording([])
    await hand(engine, tmp_path)
    assert engine.calls == ["start", "pause", "load new", "report", "confirmed new", "resume"]


async def test_a_failed_load_is_undone_before_held_requests_resume(tmp_path: Path) -> None:
    engine = Recording([EngineRejected("500"), EngineRejected("half-done")])
    with pytest.raises(HandoverFailed) as failed:
        await hand(engine, tmp_path)
    assert failed.value.weights_intact and failed.value.outcome_known
    assert engine.calls == [
        "start", "pause", "load new", "load good", "load good", "report", "resume",
    ]  # fmt: skip
    assert engine.serving == "good"


async def test_a_load_the_adapter_refused_before_asking_needs_no_reload(tmp_path: Path) -> None:
    engine = Recording([LoadNotStarted("missing directory")])
    engine.serving = "good"
    with pytest.raises(HandoverFailed) as failed:
        await hand(engine, tmp_path)
    assert failed.value.weights_intact
    assert engine.calls == ["start", "pause", "load new", "resume"]


async def test_when_every_recovery_fails_the_weights_are_unknown(tmp_path: Path) -> None:
    engine = Recording([EngineRejected("500")] * 3)
    with pytest.raises(HandoverFailed) as failed:
        await hand(engine, tmp_path)
    assert not failed.value.weights_intact
    assert engine.calls[-1] == "resume"  # held requests are never left paused


class AdapterRecording(Recording):
    """An engine that binds each request to a LoRA adapter when it admits it."""

    active_lora: str | None = None


async def test_a_swap_that_moves_the_adapter_drains_instead_of_pausing(tmp_path: Path) -> None:
    """A request admitted to the base weights (or an adapter) cannot move to another
    adapter: paused in place, it would resume on its old one under the new identity."""
    engine = AdapterRecording([])
    gate = SwapGate(AgentMetrics(CollectorRegistry()), hold_timeout_s=5, retry_after_s=1)
    await gate.enter()  # a request in flight
    lora = Staged("lora-1", 2, SnapshotKind.LORA, None)
    swap = asyncio.create_task(hand(engine, tmp_path, lora, gate, drain_timeout_s=10))
    await asyncio.sleep(0.2)
    assert gate.state is GateState.HOLDING and engine.calls == ["start"]
    gate.leave()  # it finished on the weights it began on
    await swap
    assert engine.calls == ["start", "load lora-1", "report", "confirmed lora-1"]


async def test_a_full_swap_away_from_a_served_adapter_drains_too(tmp_path: Path) -> None:
    engine = AdapterRecording([])
    engine.active_lora = "lora-1"
    await hand(engine, tmp_path)
    assert "pause" not in engine.calls and "resume" not in engine.calls
