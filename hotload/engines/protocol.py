"""The one ``Engine`` Protocol the sidecar drives, whatever serves the tokens.

An adapter swaps a verified, rebuilt snapshot (a staging directory) into a running
engine and reports which weights produced each response. The sidecar's sequence for a
swap is::

    ASYNC: await engine.pause(PauseMode.IN_PLACE)      # in-flight generations hold
           try: await engine.load_weights(path, identity, kind=kind)
           finally: await engine.resume()              # they continue on the new weights
           await engine.reset_cache(policy)
    SYNC:  (the front answers new requests 425 and waits for its in-flight ones)
           await engine.load_weights(path, identity, kind=kind)
           await engine.reset_cache(policy)

Errors are ours: ``EngineRejected`` (the engine refused these weights; it keeps serving
the old ones; this replica is Failed, not the chain), ``EngineBusy`` (retry shortly),
``EngineUnavailable`` (it does not answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind


class PauseMode(StrEnum):
    """How :meth:`Engine.pause` treats generations already running."""

    IN_PLACE = "in_place"
    """Hold them between tokens, keep their KV cache; they resume on the new weights
    (ASYNC: one response may span two policies, nobody re-prefills). New requests wait."""
    WAIT = "wait"
    """Let them finish on the old weights; new requests wait (an engine-side drain)."""


@runtime_checkable
class Engine(Protocol):
    """What the sidecar needs from an inference engine (reference, sglang, vllm, noop)."""

    @property
    def kind(self) -> EngineKind:
        """Which engine this adapter drives."""
        ...

    @property
    def base_url(self) -> str | None:
        """Where the front proxies ``/v1/*`` (``http://<pod-ip>:<port>``); None for noop."""
        ...

    async def wait_ready(self, timeout: float) -> None:
        """Return once the engine answers its health check; ``EngineUnavailable`` at ``timeout``."""
        ...

    async def health(self) -> bool:
        """True when the engine answers its health check now (never raises)."""
        ...

    async def served_identity(self) -> str | None:
        """The snapshot identity the engine says it serves (None before any load)."""
        ...

    async def load_weights(self, path: Path, identity: str, *, kind: SnapshotKind) -> None:
        """Swap in the weights under ``path`` and name them ``identity``.

        ``path`` is a full Hugging Face layout directory (config.json, *.safetensors) for
        Full and Incremental snapshots (the sidecar rebuilds deltas into a full
        directory), or a PEFT adapter directory (adapter_config.json) for LoRA. Returns
        once the engine serves them; raises ``EngineRejected`` when it refused them (it
        keeps serving the old ones).
        """
        ...

    async def pause(self, mode: PauseMode) -> None:
        """Hold generation (see :class:`PauseMode`); idempotent."""
        ...

    async def resume(self) -> None:
        """Let held generations continue and new requests in; idempotent."""
        ...

    async def reset_cache(self, policy: KvCachePolicy) -> None:
        """Apply the KV-cache policy after a swap (``all`` flushes, ``none`` keeps,
        ``new_session`` keeps running sessions' entries); ``EngineBusy`` if refused."""
        ...

    def prepare_request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The JSON body to forward for a ``/v1/*`` request (e.g. vLLM's
        ``return_weight_versions``, the LoRA adapter's model name); may return ``body``."""
        ...

    def identities_of(self, payload: Mapping[str, Any]) -> list[str]:
        """Identities that produced a response or a streamed chunk, oldest first; empty
        when the engine did not say (the front then uses :meth:`served_identity`)."""
        ...

    async def aclose(self) -> None:
        """Release the adapter's resources (never stops the engine itself)."""
        ...
