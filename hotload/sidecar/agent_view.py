"""What the front and ``/status`` read of one agent: its parts and its memory, read only.

The front (:mod:`hotload.sidecar.front`) takes a
:class:`~hotload.sidecar.front.FrontSource`; :class:`AgentView` is the agent's, built
over the same parts and the same memory the loop folds into, so the front never sees a
state the loop did not reach.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from hotload.api.kinds import Identity
from hotload.engines.protocol import Engine
from hotload.sidecar.memory import Memory
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.parts import AgentParts
from hotload.sidecar.planning import Slot
from hotload.sidecar.status import BuffersReport, StatusReport
from hotload.sidecar.swap_gate import SwapGate


class AgentView:
    """One agent as its front sees it."""

    def __init__(
        self, parts: AgentParts, registry: CollectorRegistry, memory: Callable[[], Memory]
    ) -> None:
        self._parts = parts
        self._registry = registry
        self._memory = memory

    @property
    def gate(self) -> SwapGate:
        return self._parts.gate

    @property
    def metrics(self) -> AgentMetrics:
        return self._parts.metrics

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def current_engine(self) -> Engine | None:
        return self._parts.engine

    def served_name(self) -> str | None:
        return self._parts.served_name

    def served_identity(self) -> Identity | None:
        """What the engine serves, verified, as its last report confirmed (None: nothing
        verified — the front then labels only with what the engine itself says)."""
        serving = self._memory().serving
        return serving.identity if serving else None

    def status_report(self) -> StatusReport:
        parts, buffers = self._parts, self._memory().buffers
        a, b = buffers.held(Slot.A), buffers.held(Slot.B)
        parts.status.buffers = BuffersReport(
            a=a.identity if a else None,
            b=b.identity if b else None,
            served=buffers.served.value if buffers.served else None,
            handed=buffers.handed.value if buffers.handed else None,
        )
        config, deployment = parts.config, parts.deployment
        return parts.status.report(
            pod=config.pod_name,
            namespace=config.namespace,
            deployment=config.deployment,
            engine=parts.engine.kind.value if parts.engine else None,
            transition=deployment.spec.hot_load.transition.value if deployment else None,
        )
