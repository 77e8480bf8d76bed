"""What an engine can do beyond the :class:`~hotload.engines.protocol.Engine` Protocol.

Two capabilities change how the sidecar swaps (docs/engines.md, "Capabilities"):

- :class:`PatchesInPlace` — the engine takes a verified delta (an Incremental snapshot
  directory as fetched) of the snapshot it serves and patches its live weights with it,
  checking every patched tensor's hash against the manifest; when it cannot
  (``DeltaNotApplicable``) or refuses (``EngineRejected``) it keeps its old weights, and
  the sidecar loads the rebuilt directory instead. Only a delta, not a model, crosses.
- :class:`SwapsBetweenTokens` — the engine reads and checks a load *before* it takes its
  model lock and then swaps between two tokens, applying the KV-cache policy in the same
  step: the sidecar neither pauses it nor holds new requests around an ASYNC load (the
  only pause is the engine's own swap).

A third, :class:`StagesSwitch`, serves the coordinated switch: a load staged beside
serving, swapped in at an instant. The reference engine has all three. SGLang 0.5.23 and
vLLM 0.33.0 have none: their changed-tensor entry points replace whole tensors over CUDA
IPC or NCCL from a torch process, and their disk reloads stop generation for the whole
read (docs/engines.md,
"Changed tensors only"). Capabilities are checked structurally (``isinstance`` against
these runtime-checkable Protocols), so an adapter declares one by implementing it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity


@runtime_checkable
class PatchesInPlace(Protocol):
    """An engine that patches its served weights with a verified delta."""

    async def apply_delta(
        self, path: Path, identity: Identity, *, cache_policy: KvCachePolicy | None = None
    ) -> None:
        """Patch the served weights with the delta at ``path`` (the snapshot directory as
        fetched, manifest included), then serve them as ``identity``; ``cache_policy``
        is applied in the same step. ``DeltaNotApplicable``: it cannot (layout changed,
        serving an adapter); ``EngineRejected``: it refused (another previous snapshot,
        a tensor failing its check). Either way the old weights serve on, untouched."""
        ...


@runtime_checkable
class SwapsBetweenTokens(Protocol):
    """An engine whose load lands between two tokens, the cache policy applied with it."""

    async def load_between_tokens(
        self,
        path: Path,
        identity: Identity,
        *,
        kind: SnapshotKind,
        cache_policy: KvCachePolicy | None,
    ) -> None:
        """Read and check ``path`` while serving, then swap between two tokens and apply
        ``cache_policy`` (None: keep the cache) before the next token; as
        :meth:`Engine.load_weights` otherwise."""
        ...


@runtime_checkable
class StagesSwitch(Protocol):
    """An engine that prepares a load beside serving and swaps it in at a given instant
    (a coordinated switch: docs/operator.md). The reference engine does; SGLang and vLLM
    do not (their load takes as long as their read), so the sidecar loads them at the
    switch time instead."""

    async def stage(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        """Read and check ``path`` and build its weights beside serving, held until
        :meth:`switch_at` (a new stage replaces the last). ``EngineRejected``: refused,
        the old weights serve on."""
        ...

    async def staged_identity(self) -> Identity | None:
        """The snapshot staged now (None: nothing; an engine restart loses it)."""
        ...

    async def switch_at(
        self, identity: Identity, at: datetime | None, *, cache_policy: KvCachePolicy | None
    ) -> datetime:
        """Swap the staged ``identity`` in between two tokens at ``at`` by the engine's
        clock (None or past: at once); returns the instant it took effect, in the engine's
        own words. ``EngineRejected`` when nothing is staged for it."""
        ...


@runtime_checkable
class BindsAdapterPerRequest(Protocol):
    """An engine that keeps LoRA adapters beside its base weights and binds each request
    to one (or to none) when it admits it — SGLang (``lora_path``) and vLLM (``model``).

    A request in flight stays on what it was admitted to, whatever is loaded after: a
    swap that changes the adapter served (to, from or between adapters) cannot resume
    it on the new weights, so the sidecar lets in-flight requests finish first (new ones
    held) instead of pausing them in place. The reference engine merges an adapter into
    its weights, so its requests follow every swap."""

    @property
    def active_lora(self) -> str | None:
        """The adapter requests are routed to now; None while base weights serve."""
        ...


def binds_adapter_per_request(engine: object) -> BindsAdapterPerRequest | None:
    """The engine as a :class:`BindsAdapterPerRequest`, or None when requests follow swaps."""
    return engine if isinstance(engine, BindsAdapterPerRequest) else None


def stages_switch(engine: object) -> StagesSwitch | None:
    """``engine`` as a :class:`StagesSwitch`, or None."""
    return engine if isinstance(engine, StagesSwitch) else None


def patches_in_place(engine: object) -> PatchesInPlace | None:
    """The engine as a :class:`PatchesInPlace`, or None when it cannot patch in place."""
    return engine if isinstance(engine, PatchesInPlace) else None


def swaps_between_tokens(engine: object) -> SwapsBetweenTokens | None:
    """The engine as a :class:`SwapsBetweenTokens`, or None when a load needs a pause."""
    return engine if isinstance(engine, SwapsBetweenTokens) else None


__all__ = [
    "BindsAdapterPerRequest",
    "PatchesInPlace",
    "SwapsBetweenTokens",
    "binds_adapter_per_request",
    "patches_in_place",
    "swaps_between_tokens",
]
