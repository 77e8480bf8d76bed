"""The weight-swap agent: watch the target, fetch, verify, rebuild, swap, report.

One class, built from one frozen :class:`AgentConfig` plus what is passed in (the
Kubernetes API client, a prometheus ``CollectorRegistry``, the engine). It runs until
cancelled. Everything is per instance (no module globals, no default registry), so the
pod runtime can run many agents as asyncio tasks in one process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from hotload.sidecar.config import AgentConfig

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

    from hotload.api import EngineSpec

log = logging.getLogger(__name__)

#: Builds the engine adapter once the deployment says which engine the pod runs.
EngineFactory = Callable[["EngineSpec", str], object]


class SidecarAgent:
    """One pod's agent. ``await agent.run()`` until cancelled."""

    def __init__(
        self,
        config: AgentConfig,
        api: ApiClient,
        registry: CollectorRegistry,
        engine: object,
    ) -> None:
        self.config = config
        self.api = api
        self.registry = registry
        self.engine = engine

    async def run(self) -> None:
        """Watch, load and report until cancelled; serve HTTP when ``serve_http``."""
        raise NotImplementedError
