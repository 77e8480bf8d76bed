"""Full or Incremental for the next snapshot: the cadence's rules
(:mod:`hotload.publish.cadence`) fed with what the publisher knows and what the regions say.

Besides the caller's wish and the cadence, a Full is chosen when a region marked a snapshot
of the current chain ``ChainValid=False`` (asked of every region that answers before each
delta), or when a publish saw that and the automatic fallback was off.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping

from hotload.errors import HotloadError
from hotload.publish.cadence import Decision, decide
from hotload.publish.region_client import RegionClient
from hotload.publish.state import PublisherState

log = logging.getLogger(__name__)


class KindChooser:
    """Chooses each snapshot's kind; remembers requests for a Full and broken chains."""

    def __init__(
        self,
        state: PublisherState,
        clients: Mapping[str, RegionClient],
        full_every: int,
        *,
        checkpoints: bool = False,
    ) -> None:
        """``checkpoints``: the cadence's Full goes beside the chain (a checkpoint)."""
        self._state = state
        self._clients = clients
        self._full_every = full_every
        self._checkpoints = checkpoints
        self.full_requested = threading.Event()
        """Set from any thread (``Publisher.request_full``): the next snapshot is a Full."""
        self.chain_broken = False
        """A region broke the chain and no fallback Full followed: the next is a Full."""

    async def choose(self, step: int, *, full: bool, lora: bool) -> Decision:
        last = self._state.last
        requested = full or self.full_requested.is_set()
        self.full_requested.clear()
        broken = self.chain_broken
        if last is not None and not requested and not broken and not lora:
            broken = await self._region_broke_chain()
        return decide(
            step=step,
            previous=last.previous() if last else None,
            full_every=self._full_every,
            requested_full=requested,
            chain_broken=broken,
            lora=lora,
            checkpoints=self._checkpoints,
        )

    async def _region_broke_chain(self) -> bool:
        """Whether any region answering now marked a snapshot of the current chain broken."""
        chain = set(self._state.chain)

        async def ask(client: RegionClient) -> list[str]:
            try:
                return await asyncio.to_thread(client.broken, chain)
            except HotloadError:
                return []  # a region that does not answer reports nothing

        answers = await asyncio.gather(*(ask(client) for client in self._clients.values()))
        broken = sorted({name for names in answers for name in names})
        if broken:
            log.warning("a region reports a broken chain", extra={"snapshots": broken})
        return bool(broken)
