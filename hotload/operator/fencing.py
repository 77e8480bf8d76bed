"""Who may write decisions: the holder of the region's leader Lease, and only while it holds it.

Every operator write that decides (a target, a PolicySnapshot's record, a latch, an Event,
a deployment's status, a finalizer) carries a :class:`Fence`: the Lease's holder and its
``leaseTransitions`` when this operator acquired it. The write is refused

- here, before it is sent, when this operator's tenure has ended or may have ended
  (:meth:`Leadership.fence` raises :class:`~hotload.errors.NotLeader`);
- by the apiserver, when the chart's admission policy finds that the token the write
  carries is not the Lease's now (a writer frozen between its check and its request, then
  resumed after another took over: the case a time-based lease alone cannot close);
- by the apiserver, when the object changed since the view the write was planned from
  (every status write is conditioned on the resourceVersion it was planned on).

:mod:`hotload.operator.lease` holds the Lease; :class:`Standalone` is the leadership of a
single operator run without one (``--standalone``: tests and development, never the chart).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hotload.api.labels import FENCE_ANNOTATION

FENCE_FIELD = "fence"
"""The status field each fenced status write sets to the writer's token."""


@dataclass(frozen=True)
class Fence:
    """One tenure of the leader Lease: its holder and ``leaseTransitions`` when acquired."""

    holder: str
    epoch: int

    @property
    def token(self) -> str:
        """``<holder>/<epoch>``: what the admission policy compares with the Lease."""
        return f"{self.holder}/{self.epoch}"


class Leadership(Protocol):
    """What the reconcilers and the executor ask of the leader election."""

    @property
    def tenure(self) -> int:
        """Counts the tenures this process gained; a reconciler that sees it change
        rebuilds its view (another leader wrote meanwhile)."""
        ...

    @property
    def leading(self) -> bool: ...

    async def wait_leading(self) -> int:
        """Return (the tenure) once this process leads."""
        ...

    def fence(self) -> Fence | None:
        """The fence of the current tenure; raises ``NotLeader`` when there is none (or it
        may have ended). None: this operator runs without a Lease (``--standalone``)."""
        ...

    def suspect(self) -> None:
        """A write was refused for its fence: read the Lease again now."""
        ...


class Standalone:
    """The leadership of the only operator (``--standalone``): always leading, no fence."""

    def __init__(self) -> None:
        self._leading = asyncio.Event()
        self._leading.set()

    @property
    def tenure(self) -> int:
        return 1

    @property
    def leading(self) -> bool:
        return True

    async def wait_leading(self) -> int:
        return 1

    def fence(self) -> Fence | None:
        return None

    def suspect(self) -> None:
        return None


def fenced_status(status: Mapping[str, Any], fence: Fence | None) -> dict[str, Any]:
    """A status patch that carries the writer's fence token."""
    patch = dict(status)
    if fence is not None:
        patch[FENCE_FIELD] = fence.token
    return patch


def fenced_metadata(metadata: Mapping[str, Any], fence: Fence | None) -> dict[str, Any]:
    """Object metadata that carries the writer's fence token as an annotation."""
    merged = dict(metadata)
    if fence is not None:
        merged["annotations"] = {
            **dict(metadata.get("annotations") or {}),
            FENCE_ANNOTATION: fence.token,
        }
    return merged
