"""The front's traffic gate: what a request meets while a swap runs.

DESIGN.md, Flow and "Figures from the field": only the swap itself touches traffic.

- ``ASYNC``: at the swap the engine pauses its in-flight generations and resumes them on
  the new weights; new requests are *held* here until the swap ends (bounded by a hold
  timeout), nobody gets an error.
- ``SYNC``: in-flight requests finish on the old weights (the swap waits for them to
  drain, up to a drain timeout: one endless stream must not hold the replica in 425
  forever); new requests are answered ``425 Too Early`` with ``Retry-After`` until the
  swap ends, and retry with the same session key. Requests still running at the timeout
  continue across the swap, each chunk naming the weights that produced it.

The gate counts requests in flight (admitted and not yet finished, streams included) so
a SYNC swap knows when the old weights have nothing left to do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import StrEnum

from hotload.api import Transition
from hotload.errors import EngineBusy
from hotload.sidecar.metrics import AgentMetrics

log = logging.getLogger(__name__)


class GateState(StrEnum):
    OPEN = "open"
    HOLDING = "holding"
    """ASYNC swap: new requests wait."""
    REFUSING = "refusing"
    """SYNC swap: new requests get 425."""


class TooEarly(Exception):
    """A SYNC swap is running: answer 425 with ``Retry-After``."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("a swap is running; retry shortly")
        self.retry_after_s = retry_after_s


class HoldTimeout(Exception):
    """An ASYNC swap outlasted the hold timeout: answer 503 with ``Retry-After``."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("the swap outlasted the hold timeout")
        self.retry_after_s = retry_after_s


class SwapGate:
    """Admission of requests to the engine around swaps; one per agent."""

    def __init__(self, metrics: AgentMetrics, *, hold_timeout_s: float, retry_after_s: int) -> None:
        self._metrics = metrics
        self.hold_timeout_s = hold_timeout_s
        self.retry_after_s = retry_after_s
        self.state = GateState.OPEN
        self.in_flight = 0
        self.held = 0
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Event()
        self._drained.set()

    async def enter(self) -> None:
        """Admit one request (wait while ASYNC-holding; refuse while SYNC-refusing)."""
        if self.state is GateState.REFUSING:
            self._metrics.refused_requests.inc()
            raise TooEarly(self.retry_after_s)
        if self.state is GateState.HOLDING:
            self.held += 1
            self._metrics.held_requests.inc()
            self._metrics.held_requests_total.inc()
            try:
                async with asyncio.timeout(self.hold_timeout_s):
                    while self.state is GateState.HOLDING:
                        await self._open.wait()
            except TimeoutError as err:
                raise HoldTimeout(self.retry_after_s) from err
            finally:
                self.held -= 1
                self._metrics.held_requests.dec()
            if self.state is GateState.REFUSING:
                self._metrics.refused_requests.inc()
                raise TooEarly(self.retry_after_s)
        self.in_flight += 1
        self._drained.clear()

    def leave(self) -> None:
        """A request admitted by :meth:`enter` has finished (its last byte is out)."""
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._drained.set()

    @asynccontextmanager
    async def swapping(
        self,
        transition: Transition,
        drain_timeout_s: float | None = None,
        *,
        drain: bool = False,
    ) -> AsyncIterator[None]:
        """Close the gate the way ``transition`` says for the duration of the block.

        SYNC waits here, refusing new requests, until every admitted request has finished
        on the old weights or ``drain_timeout_s`` passed (None: no limit); ASYNC holds new
        requests and lets admitted ones be paused by the engine inside the block — or,
        with ``drain``, waits for them to finish as SYNC does while still holding, not
        refusing, new ones (a swap that in-flight requests cannot follow). A
        cancellation while draining (a newer target) reopens the gate.
        """
        if self.state is not GateState.OPEN:
            raise EngineBusy("another swap is running")
        self._open.clear()
        if transition is Transition.SYNC:
            self.state = GateState.REFUSING
            if self.in_flight:
                log.info(
                    "SYNC swap: waiting for in-flight requests",
                    extra={"in_flight": self.in_flight},
                )
        else:
            self.state = GateState.HOLDING
        try:
            if transition is Transition.SYNC or drain:
                try:
                    async with asyncio.timeout(drain_timeout_s):
                        await self._drained.wait()
                except TimeoutError:
                    log.warning(
                        "in-flight requests outlasted the drain timeout; swapping",
                        extra={
                            "transition": transition.value,
                            "in_flight": self.in_flight,
                            "drain_timeout_s": drain_timeout_s,
                        },
                    )
            yield
        finally:
            self.state = GateState.OPEN
            self._open.set()
