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

Errors are ours: ``EngineRejected`` (the engine refused these weights; whether it keeps
serving the old ones is what ``rollback_trusted`` says; this replica is Failed, not the
chain), ``EngineBusy`` (retry shortly; it did not start the load), ``EngineUnavailable``
(it does not answer).

The engine is the source of truth for what a replica serves: :meth:`Engine.report`
answers with an :class:`EngineReport`, which the sidecar asks for on every reconcile and
at least every 5 s, and reports on the pod only what it says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity


class PauseMode(StrEnum):
    """How :meth:`Engine.pause` treats generations already running."""

    IN_PLACE = "in_place"
    """Hold them between tokens, keep their KV cache; they resume on the new weights
    (ASYNC: one response may span two policies, nobody re-prefills). New requests wait."""
    WAIT = "wait"
    """Let them finish on the old weights; new requests wait (an engine-side drain)."""


@dataclass(frozen=True)
class EngineReport:
    """What an engine says it serves, in its own words."""

    identity: Identity | None
    """The identity of the weights it serves; None while it serves weights it was not
    handed by a sidecar (its launch weights: the reference engine's ``init``, SGLang's and
    vLLM's ``default``)."""
    instance_id: str | None
    """Changes whenever the engine process restarts (None: the engine has no such id;
    a restart then shows as its identity returning to the launch value)."""
    digest: str | None
    """The served weights' tensor-set digest — ``hotload.snapshot.manifest_digest`` of
    the snapshot they came from: xxh3-128 over ``name NUL xxh3-128(tensor bytes) LF``
    sorted by name, tensors as the snapshot stores them — or None when not asked for or
    not offered. Only a digest comparable to the manifest's is reported here."""
    generation: str | None = None
    """Changes with every load the engine takes, whoever sent it, even under a name it
    already serves (the reference engine's count of swaps; SGLang's path of the last disk
    update); None where the engine offers nothing that changes with a load (vLLM). The
    sidecar compares it on every look, so a load it did not send is seen within one."""
    paused: bool | None = None
    """Whether generation is held now (a pause nobody resumed); None where the engine does
    not say. Outside its own swaps the sidecar resumes a paused engine."""


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

    @property
    def rollback_trusted(self) -> bool:
        """Whether a failed or refused load leaves the old weights serving (the reference
        engine validates everything before it swaps). False: after a failed load the
        weights are unknown and the sidecar reloads the served snapshot."""
        ...

    async def report(self, *, digest: bool = False) -> EngineReport:
        """What the engine serves now, from the engine itself. ``digest``: also the
        served weights' digest where the engine can compute it (after a swap; periodic
        checks leave it off). ``EngineUnavailable`` when it does not answer."""
        ...

    async def load_weights(self, path: Path, identity: Identity, *, kind: SnapshotKind) -> None:
        """Swap in the weights under ``path`` and name them ``identity``.

        ``path`` is a full Hugging Face layout directory (config.json, *.safetensors) for
        Full and Incremental snapshots (the sidecar rebuilds deltas into a full
        directory), or a PEFT adapter directory (adapter_config.json) for LoRA. Returns
        once the engine serves them; raises ``EngineRejected`` when it refused them (it
        keeps serving the old ones).
        """
        ...

    async def pause(self, mode: PauseMode, *, cache_policy: KvCachePolicy | None = None) -> None:
        """Hold generation (see :class:`PauseMode`); idempotent. ``cache_policy`` (the
        target's) lets an engine that must know it at pause time apply it there; None
        keeps the cache."""
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
        when the engine did not say (the front then uses the identity its last report
        named)."""
        ...

    async def aclose(self) -> None:
        """Release the adapter's resources (never stops the engine itself)."""
        ...
