"""What the sidecar's observer, job runner and loop share: the building blocks, no memory.

:class:`AgentParts` holds the engine adapter and the snapshot loader (each built lazily,
from the deployment the loop last saw), the staging area, the swap gate, the metrics,
the status ``/status`` shows, and the :class:`HandoverFence` that tells an observation
that a handover began or ended under it. The agent's memory is not here: it lives in the
loop and changes only by :func:`hotload.sidecar.memory.fold`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from hotload.api import LoadPath, ReplicaState, RolloutDeployment, SnapshotRef
from hotload.engines.protocol import Engine
from hotload.errors import HotloadError, NotFound
from hotload.sidecar.config import AgentConfig
from hotload.sidecar.loader import LoadTimings, SnapshotLoader
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.planning import Staged
from hotload.sidecar.staging import StagingArea
from hotload.sidecar.status import AgentStatus, Phase, SwapRecord
from hotload.sidecar.swap_gate import SwapGate
from hotload.storage import Storage, open_storage

if TYPE_CHECKING:
    from hotload.api import EngineSpec

log = logging.getLogger("hotload.sidecar.agent")

#: Builds the engine adapter once the deployment says which engine the pod runs.
EngineFactory = Callable[["EngineSpec"], Engine]


@dataclass
class HandoverFence:
    """Whether a buffer is being handed to the engine, and how many handovers began or
    ended: an engine report taken before either is stale (the observer drops it)."""

    handing: bool = False
    epoch: int = 0

    def begin(self) -> None:
        self.handing = True
        self.epoch += 1

    def end(self) -> None:
        self.handing = False
        self.epoch += 1

    def release(self) -> None:
        """A job ended (however): no buffer is being handed any more."""
        self.handing = False

    def moved(self, epoch: int) -> bool:
        """A handover runs now, or began or ended since ``epoch`` was read."""
        return self.handing or epoch != self.epoch


def _storage_settings(deployment: RolloutDeployment) -> tuple[str, str | None, str | None]:
    hot_load = deployment.spec.hot_load
    return hot_load.bucket_url, hot_load.endpoint, hot_load.region


class AgentParts:
    """The building blocks of one agent (see the module docstring)."""

    def __init__(
        self, config: AgentConfig, metrics: AgentMetrics, engine: Engine | EngineFactory
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.engine: Engine | None = engine if isinstance(engine, Engine) else None
        self._engine_factory = None if isinstance(engine, Engine) else engine
        self.staging = StagingArea(config.staging_dir)
        self.status = AgentStatus(history=deque(maxlen=config.history_limit))
        self.gate = SwapGate(
            metrics, hold_timeout_s=config.hold_timeout_s, retry_after_s=config.retry_after_s
        )
        self.fence = HandoverFence()
        self.deployment: RolloutDeployment | None = None
        self.served_name: str | None = None
        """``spec.model.servedName`` of the deployment last seen."""
        self._storage: Storage | None = None
        self._storage_key: tuple[str, str | None, str | None] | None = None
        self._loader: SnapshotLoader | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._rng = random.Random()

    def context(self) -> dict[str, str]:
        return {"pod": self.config.pod_name, "namespace": self.config.namespace}

    def delay(self, attempt: int) -> float:
        """The backoff delay before retry number ``attempt`` (0-based), with jitter."""
        return self.config.retry.delay(attempt, self._rng)

    def target(self) -> SnapshotRef | None:
        deployment = self.deployment
        if deployment is None or deployment.status is None:
            return None
        return deployment.status.target_snapshot

    def see_deployment(self, deployment: RolloutDeployment | None) -> None:
        """The deployment's newest state from the watch (None: gone): its served name and
        target step go with it to the front and the metrics."""
        self.deployment = deployment
        if deployment is not None:
            self.served_name = deployment.spec.model.served_name
            target = deployment.status.target_snapshot if deployment.status else None
            if target is not None:
                self.metrics.target_step.set(target.step)

    def require_deployment(self) -> RolloutDeployment:
        deployment = self.deployment
        if deployment is None:
            raise NotFound("the deployment is gone", deployment=self.config.deployment)
        return deployment

    def ensure_engine(self, deployment: RolloutDeployment) -> Engine:
        if self.engine is None:
            if self._engine_factory is None:
                raise RuntimeError("no engine and no engine factory")
            self.engine = self._engine_factory(deployment.spec.engine)
        return self.engine

    def engine_for_probes(self, deployment: RolloutDeployment) -> None:
        """Build the engine adapter as soon as the deployment names it, so ``/readyz``
        answers for the engine before any target exists."""
        try:
            self.ensure_engine(deployment)
        except HotloadError as err:
            log.error(
                "cannot build the engine adapter", extra={**self.context(), "error": str(err)}
            )

    def ensure_loader(self, deployment: RolloutDeployment) -> SnapshotLoader:
        settings = _storage_settings(deployment)
        if self._loader is None or self._storage_key != settings:
            old = self._storage
            url, endpoint, region = settings
            self._storage = open_storage(
                url, endpoint=endpoint, region=region, credentials=self.config.credentials
            )
            self._storage_key = settings
            self._loader = SnapshotLoader(
                self._storage,
                self.staging,
                self.metrics,
                concurrency=self.config.download_concurrency,
                part_size=self.config.download_part_size,
                decode_threads=self.config.decode_threads,
                on_phase=self._set_phase,
                on_bytes=self._set_bytes,
            )
            if old is not None:
                closing = asyncio.get_running_loop().create_task(old.aclose())
                self._background.add(closing)
                closing.add_done_callback(self._background.discard)
        return self._loader

    def _set_phase(self, phase: Phase) -> None:
        self.status.phase = phase

    def _set_bytes(self, done: int, total: int) -> None:
        self.status.bytes_done = done
        self.status.bytes_total = total

    def record_swap(
        self,
        staged: Staged,
        via: LoadPath,
        timings: LoadTimings,
        started: datetime,
        *,
        in_engine: bool = False,
    ) -> None:
        """A swap in ``/status``'s history, the metrics and the log."""
        self.metrics.swaps.labels(via=via.value).inc()
        seconds = {name: round(value, 6) for name, value in timings.seconds.items()}
        seconds["total"] = round((datetime.now(UTC) - started).total_seconds(), 6)
        self.status.history.append(
            SwapRecord(
                identity=staged.identity,
                step=staged.step,
                kind=staged.kind.value,
                via=via,
                outcome=ReplicaState.READY,
                started_at=started,
                finished_at=datetime.now(UTC),
                seconds=seconds,
                fetched_bytes=timings.fetched_bytes,
                stored_bytes=timings.stored_bytes,
                in_engine=in_engine,
            )
        )
        log.info(
            "snapshot swapped in",
            extra={
                **self.context(),
                "snapshot": staged.identity,
                "step": staged.step,
                "via": via.value,
                "in_engine": in_engine,
                "seconds": seconds,
                "fetched_bytes": timings.fetched_bytes,
            },
        )

    async def aclose(self) -> None:
        """Close the storage client, and the engine adapter when this agent built it."""
        if self._storage is not None:
            with contextlib.suppress(Exception):
                await self._storage.aclose()
        if self.engine is not None and self._engine_factory is not None:
            with contextlib.suppress(Exception):
                await self.engine.aclose()
