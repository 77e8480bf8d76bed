"""The reference engine's core: the served model, hot swaps, pausing, token generation.

One model serves at a time; every forward step and every swap holds ``model_lock``, so a
swap lands exactly between two tokens and no step ever sees half-copied weights. Each
generated token is labelled with the identity of the weights that produced it.

Swaps: weights are read and validated in a thread *before* the lock is taken (a refusal
changes nothing: the old weights keep serving). An engine computing in another dtype than
the snapshot's (float32 on CPU, the default) also builds the new parameters there, so
under the lock the parameters are only pointed at them (a pause of a few milliseconds,
whatever the model's size; the old and new parameters coexist during the swap: one
more copy of the model in memory); otherwise, under the lock, they are copied into the
served parameters (Full/Incremental). A delta (``apply_delta``) is patched into the held
bits beside serving; the new float32 parameters are the spare (the step before's
parameters, kept) brought forward by the elements the last two deltas wrote. For LoRA
the served model is replaced by the base merged with the adapter (LoRA, through PEFT;
the base stays aside for the next adapter). Only one load runs at a time (a second one
is ``EngineBusy``). A load or a delta may carry the KV-cache policy, applied under the
same lock as the swap, so no request ever meets the new weights with the old cache (the
sidecar then needs neither a pause nor a held gate around the load: docs/engines.md,
"Capabilities").

The served weights' digest (``/admin/identity?digest=true``) is computed from the held
bits under ``_storage_lock``, not the model lock, when the engine holds its own copy
(another compute dtype): tokens keep flowing meanwhile. After a delta it is the delta's
manifest digest, proven by the patch, which checked every tensor's hash against it.

A coordinated switch (docs/operator.md) stages first: ``stage`` prepares a load exactly as a
load does (read, validated, the new parameters built beside serving) and holds it;
``switch`` takes the lock just before the requested wall-clock instant and swaps between
two tokens at it. Every swap is recorded with the wall-clock time it took effect
(``swap_log``, in ``/admin/identity``): the engine's own word on when it switched.

Pausing (``PauseMode``): ``in_place`` stops in-flight generations before their next
token and holds new ones; ``wait`` holds new ones and returns once in-flight ones ended.
``resume`` releases both. Forward passes run in threads so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, Qwen2Config

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.protocol import PauseMode
from hotload.engines.reference import delta, priority
from hotload.engines.reference import model as rm
from hotload.engines.reference import tokenizer as tok
from hotload.engines.reference.cache import DEFAULT_CAPACITY, PromptCache
from hotload.engines.reference.spare import SpareParameters, WrittenElements
from hotload.engines.reference.weights import merge_lora, read_full_snapshot
from hotload.errors import EngineBusy, EngineRejected
from hotload.snapshot import manifest_digest
from hotload.snapshot.digest import tensor_hash, tensor_set_digest

log = logging.getLogger(__name__)

INITIAL_IDENTITY = "init"
SWITCH_LOCK_AHEAD_S = 0.05
"""A timed switch takes the model lock this long before its instant (the step running then
ends first), so that the swap lands on the instant, not one forward step after it."""
SWAP_LOG_LENGTH = 16
DECODE_THREADS = 2
"""Threads decoding a delta's chunks: the patch's length is the time to Ready, and the
forward passes streaming meanwhile still win the cores when the patch runs with a
``patch_nice`` (bench/swap/results.md measures both)."""


GREEDY_BELOW = 1e-5
"""A temperature below this samples greedily, as vLLM does (``_SAMPLING_EPS``, vllm
0.32.0 vllm/sampling_params.py:29 and :612): dividing the logits by a temperature of 6e-59
(the front's fuzz test found it) overflowed them to inf, the softmax to NaN, and the
request ended in a 500."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float | None = None
    """None or below :data:`GREEDY_BELOW`: greedy."""
    top_p: float | None = None
    seed: int | None = None
    session: str | None = None

    @property
    def greedy(self) -> bool:
        return not self.temperature or self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    text: str
    identity: Identity
    finish_reason: str | None
    """``stop`` (EOS), ``length`` (max_tokens or context), or None while going on."""


@dataclass
class GenerationStats:
    """Filled while a generation runs; read for ``usage``."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    identities: list[Identity] = field(default_factory=list)


@dataclass(frozen=True)
class LoadReport:
    identity: Identity
    kind: SnapshotKind
    read_seconds: float
    swap_seconds: float


@dataclass
class _Prepared:
    kind: SnapshotKind
    tensors: dict[str, torch.Tensor] | None = None
    merged: torch.nn.Module | None = None
    changed: dict[str, torch.Tensor] | None = None
    """Per tensor, the flat positions whose bits differ from the held ones (found beside
    serving): then only those elements are written between two tokens."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Tied aliases the snapshot's files carried (alias → canonical name)."""
    fresh: dict[str, torch.Tensor] | None = None
    """An engine with its own copy of the bits: the new parameters, already in the
    compute dtype, built beside serving; the swap only points the parameters at them."""
    held: dict[str, torch.Tensor] | None = None
    """With ``fresh``: the new held bits (the snapshot's dtype)."""


@dataclass(frozen=True)
class SwapRecord:
    """One swap as the engine saw it."""

    identity: Identity
    how: str
    """``load``, ``delta`` or ``switch`` (a staged load swapped at a requested instant)."""
    at: float
    """Wall-clock time (Unix seconds) when the new weights began serving."""
    requested_at: float | None = None
    """A timed switch's requested instant."""

    def describe(self) -> dict[str, Any]:
        return {"identity": self.identity, "how": self.how, "at": self.at,
                "requested_at": self.requested_at}  # fmt: skip


@dataclass
class _Staged:
    """A load prepared beside serving, held until its switch."""

    identity: Identity
    kind: SnapshotKind
    path: Path
    prepared: _Prepared
    swaps: int
    """The engine's swap count when prepared: a swap since makes the preparation stale
    (it may have been built against the weights served then)."""


def _point_at(parameters: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> None:
    """Point each named parameter at its new tensor (built beside serving): the whole
    swap between two tokens is this loop of pointer changes, whatever the model's size."""
    with torch.no_grad():
        for name, tensor in fresh.items():
            parameters[name].data = tensor.view_as(parameters[name])


def _bits_hash(tensor: torch.Tensor) -> str:
    """xxh3-128 of a tensor's bytes as stored (a contiguous one is read in place)."""
    if not tensor.numel():
        return tensor_hash(b"")
    flat = tensor.detach().contiguous().reshape(-1)
    return tensor_hash(flat.view(torch.uint8).numpy().data)


class ReferenceRuntime:
    """Holds the model and serves tokens; the FastAPI app is a thin shell over this."""

    def __init__(
        self,
        config: Qwen2Config,
        *,
        compute_dtype: torch.dtype = torch.float32,
        seed: int = rm.DEFAULT_SEED,
        cache_capacity: int = DEFAULT_CAPACITY,
        patch_nice: int = 0,
    ) -> None:
        self.config = config
        self._patch_pool = priority.patch_pool(patch_nice)
        """The thread that patches deltas beside serving, ``patch_nice`` below the
        forward passes' priority (:mod:`~hotload.engines.reference.priority`)."""
        self._spare_pool = priority.patch_pool(patch_nice, name="spare")
        """The thread that brings the spare parameters forward, tensor by tensor, while
        the patch decodes the next ones (same priority)."""
        self._decode_pool = priority.patch_pool(patch_nice, workers=DECODE_THREADS, name="decode")
        """The threads that decode a tensor's chunks in parallel (same priority)."""
        self.instance_id = uuid.uuid4().hex
        """New at every start: a sidecar tells a restarted engine by it."""
        self.loaded = False
        """True once weights were loaded (``--weights`` or a swap), not the seeded init."""
        self.loading: str | None = None
        """The identity being loaded right now, if any."""
        self.token_delay_s = 0.0
        """Seconds to wait before computing each token (``POST /admin/token_delay``): a
        slow generation for tests whose stream must outlast a drain limit."""
        self.swap_delay_s = 0.0
        """Seconds between reading a load's files (or patching a delta's) and swapping
        them in: a slow engine, set through ``POST /admin/swap_delay`` by
        fault-injection tests."""
        self._loaded_aliases: dict[str, str] = {}
        self._digest: tuple[int, str | None] | None = None
        self.compute_dtype = compute_dtype
        self.storage_dtype = rm.storage_dtype(config)
        self._base: torch.nn.Module = rm.build_model(config, seed=seed, compute_dtype=compute_dtype)
        self._serving: torch.nn.Module = self._base
        self._specs = rm.parameter_specs(self._base, self.storage_dtype)
        self._aliases = rm.tied_aliases(self._base)
        self.identity = INITIAL_IDENTITY
        self.kind = SnapshotKind.FULL
        self.cache = PromptCache(cache_capacity)
        self.model_lock = asyncio.Lock()
        self._storage_lock = asyncio.Lock()
        """Held while the held bits (``_storage``) change or are hashed: a digest then
        never sees half a swap, without stopping generation (which reads the parameters)."""
        self._admit = asyncio.Event()
        self._flow = asyncio.Event()
        self._admit.set()
        self._flow.set()
        self._active = 0
        self._admitting = 0
        """Generations waiting to be admitted (held by a pause)."""
        self._idle = asyncio.Condition()
        self._loading = False
        self._unwaited: set[asyncio.Future[LoadReport]] = set()
        """Loads and patches running (:meth:`_to_the_end`): a reference keeps each alive."""
        self.swaps = 0
        self.swap_log: deque[SwapRecord] = deque(maxlen=SWAP_LOG_LENGTH)
        """The last swaps, newest last, each with the wall-clock time it took effect."""
        self._staged: _Staged | None = None
        """A load staged for a coordinated switch (``stage``), until ``switch``."""
        self.deltas_applied = 0
        """Deltas patched in place (``apply_delta``) since the start."""
        self._storage: dict[str, torch.Tensor] | None = None
        """The served weights' exact bits in the snapshot's dtype, which deltas patch in
        place (the parameters themselves when they are that dtype); None under LoRA."""
        self._spare = SpareParameters()
        """With its own copy of the bits: the parameters of the step before the last
        delta, which the next delta brings forward sparsely (empty after a load)."""

    # --- state -----------------------------------------------------------------------

    @property
    def _own_copy(self) -> bool:
        """The held bits are a copy beside the parameters (they compute in another dtype);
        else they are the parameters themselves."""
        return self.compute_dtype != self.storage_dtype

    @property
    def paused(self) -> bool:
        return not self._admit.is_set()

    @property
    def active_generations(self) -> int:
        return self._active

    @property
    def max_context(self) -> int:
        return int(self.config.max_position_embeddings)

    # --- swaps -----------------------------------------------------------------------

    def _prepare(self, path: Path, kind: SnapshotKind) -> _Prepared:
        if kind is SnapshotKind.LORA:
            return _Prepared(kind, merged=self._merge_lora(path))
        tensors = read_full_snapshot(
            path, expected=self._specs, aliases=self._aliases, architecture=self.config
        )
        present = rm.tensor_names(path)
        aliases = {a: c for a, c in self._aliases.items() if a in present}
        if self._own_copy:
            # Everything the swap needs is built here, beside serving: the widening to the
            # compute dtype is exact, so the new parameters equal the snapshot's bits.
            fresh = {name: tensor.to(self.compute_dtype) for name, tensor in tensors.items()}
            held = {name: tensor.detach().clone() for name, tensor in tensors.items()}
            return _Prepared(kind, tensors=tensors, aliases=aliases, fresh=fresh, held=held)
        storage = self._storage
        if storage is None or self._serving is not self._base:
            return _Prepared(kind, tensors=tensors, aliases=aliases)
        # A near-identical snapshot (the next RL step): find what differs now, beside
        # serving, so the pause only writes those elements.
        changed = {
            name: delta.changed_positions(storage[name], tensor) for name, tensor in tensors.items()
        }
        return _Prepared(kind, tensors=tensors, changed=changed, aliases=aliases)

    def _prepare_staged(self, path: Path, kind: SnapshotKind) -> _Prepared:
        """A preparation whose swap is pointer changes only (new parameters built beside
        serving, whatever the dtypes), so that a timed switch lands on its instant."""
        prepared = self._prepare(path, kind)
        if prepared.merged is not None or prepared.fresh is not None:
            return prepared
        tensors = prepared.tensors or {}
        # Copies: the tensors read may be views of the snapshot's files.
        fresh = {name: t.to(self.compute_dtype, copy=True) for name, t in tensors.items()}
        # Not an own copy: the held bits are the parameters themselves, i.e. ``fresh``.
        return _Prepared(kind, tensors=tensors, aliases=prepared.aliases, fresh=fresh, held=fresh)

    def _merge_lora(self, path: Path) -> torch.nn.Module:
        return merge_lora(self._base, path)

    def _apply(self, prepared: _Prepared) -> None:
        if prepared.merged is not None:
            self._serving = prepared.merged
            self._storage = None
            return
        tensors = prepared.tensors or {}
        parameters = rm.parameters(self._base)
        if prepared.fresh is not None and prepared.held is not None:
            _point_at(parameters, prepared.fresh)
            self._serving = self._base
            self._storage = prepared.held
            return
        if prepared.changed is not None and self._storage is not None:
            delta.write_positions(prepared.changed, tensors, self._storage, parameters)
            return
        with torch.no_grad():
            for name, param in parameters.items():
                param.copy_(tensors[name])
        self._serving = self._base
        if not self._own_copy:
            self._storage = parameters
        else:  # own copies: the loaded tensors may be views of the snapshot's files
            self._storage = {name: tensors[name].detach().clone() for name in parameters}

    async def _to_the_end(self, work: Coroutine[Any, Any, LoadReport]) -> LoadReport:
        """Run a load or a patch to its end even when its caller is cancelled.

        Both change state in steps that must go together (held bits, parameters, identity,
        digest), some of them on threads a cancellation cannot stop: a caller cancelled
        midway would leave, say, patched held bits under the old parameters and the old
        name. So the work runs as its own task; a cancelled caller stops waiting for it,
        and it finishes (or fails whole) as if nobody had left. Its outcome is then only
        in the engine's report (what a sidecar asks next), and in the log."""
        task = asyncio.ensure_future(work)
        self._unwaited.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Future[LoadReport]) -> None:
        self._unwaited.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here, or asyncio would report a failure whose caller had left as
            # never retrieved; logged for that case (a caller still waiting gets it too).
            log.info("a load ended in failure", extra={"error": str(task.exception())})

    async def apply_delta(
        self, path: Path, identity: Identity, *, cache_policy: KvCachePolicy | None = None
    ) -> LoadReport:
        """Patch the served weights with the delta at ``path`` (docs/engines.md).

        Checked and decoded beside serving when the model computes in another dtype than
        the snapshot's (only the changed elements are copied between two tokens), else
        between two tokens as a whole. ``LayoutChanged`` or ``EngineRejected`` leave the
        old weights serving, untouched. ``cache_policy`` is applied between the same two
        tokens as the patch. Runs to its end even if the caller is cancelled.
        """
        return await self._to_the_end(self._apply_delta(path, identity, cache_policy))

    async def _apply_delta(
        self, path: Path, identity: Identity, cache_policy: KvCachePolicy | None
    ) -> LoadReport:
        if self._loading:
            raise EngineBusy("another load is running", identity=identity)
        self._loading = True
        self.loading = identity
        try:
            async with self._storage_lock:
                return await self._patch(path, identity, cache_policy)
        finally:
            self._loading = False
            self.loading = None

    async def _patch(
        self, path: Path, identity: Identity, cache_policy: KvCachePolicy | None
    ) -> LoadReport:
        started = time.perf_counter()
        storage = self._storage
        manifest = delta.read_delta(path, self.identity, self.kind)
        if storage is None:
            raise delta.LayoutChanged("serving a LoRA merge: load the rebuilt directory")
        if manifest.identity != identity:
            raise EngineRejected(
                "the delta is another snapshot", expected=identity, found=manifest.identity
            )
        delta.check_layout(manifest, storage)
        parameters = rm.parameters(self._base)
        shared = not self._own_copy
        fresh: dict[str, torch.Tensor] = {}
        written = WrittenElements()
        if not shared:
            fresh, written = await asyncio.get_running_loop().run_in_executor(
                self._patch_pool,
                delta.patch_into_spare,
                storage,
                path,
                manifest,
                self.identity,
                self._spare,
                self.compute_dtype,
                self._spare_pool,
                self._decode_pool,
            )
        read_done = time.perf_counter()
        if self.swap_delay_s:
            await asyncio.sleep(self.swap_delay_s)
        async with self.model_lock:
            if shared:
                await asyncio.to_thread(delta.patch_storage, storage, path, manifest, self.identity)
            else:
                replaced = {name: parameters[name].data for name in fresh}
                _point_at(parameters, fresh)
                self._spare.keep(replaced, written)
            if cache_policy is not None:
                self.cache.apply(cache_policy)
            previous, self.identity = self.identity, identity
            self.kind = SnapshotKind.INCREMENTAL
            self.swaps += 1
            self.swap_log.append(SwapRecord(identity, "delta", time.time()))
            self.deltas_applied += 1
            # The patch checked every tensor's hash against this manifest.
            self._loaded_aliases = {}
            self._digest = (self.swaps, manifest_digest(manifest))
        swapped = time.perf_counter() - read_done
        report = LoadReport(identity, SnapshotKind.INCREMENTAL, read_done - started, swapped)
        log.info(
            "delta applied in place",
            extra={
                "snapshot": identity,
                "previous": previous,
                "path": str(path),
                "patch_s": round(report.read_seconds, 4),
                "swap_s": round(report.swap_seconds, 4),
            },
        )
        return report

    async def load(
        self,
        path: Path,
        identity: Identity,
        kind: SnapshotKind,
        *,
        cache_policy: KvCachePolicy | None = None,
    ) -> LoadReport:
        """Validate, then swap between two tokens; ``EngineRejected`` leaves the old weights.
        Runs to its end even if the caller is cancelled."""
        return await self._to_the_end(self._load(path, identity, kind, cache_policy))

    async def _load(
        self,
        path: Path,
        identity: Identity,
        kind: SnapshotKind,
        cache_policy: KvCachePolicy | None,
    ) -> LoadReport:
        if self._loading:
            raise EngineBusy("another load is running", identity=identity)
        self._loading = True
        self.loading = identity
        self._spare.drop()  # the parameters are replaced whole: no delta to catch up with
        try:
            started = time.perf_counter()
            prepared = await asyncio.to_thread(self._prepare, path, kind)
            read_done = time.perf_counter()
            if self.swap_delay_s:
                await asyncio.sleep(self.swap_delay_s)
            async with self.model_lock, self._storage_lock:
                await asyncio.to_thread(self._apply, prepared)
                if cache_policy is not None:
                    self.cache.apply(cache_policy)
                previous, self.identity, self.kind = self.identity, identity, kind
                self._loaded_aliases = prepared.aliases
                self.loaded = True
                self.swaps += 1
                self.swap_log.append(SwapRecord(identity, "load", time.time()))
            report = LoadReport(
                identity, kind, read_done - started, time.perf_counter() - read_done
            )
            log.info(
                "weights swapped",
                extra={
                    "snapshot": identity,
                    "previous": previous,
                    "kind": kind.value,
                    "path": str(path),
                    "read_s": round(report.read_seconds, 4),
                    "swap_s": round(report.swap_seconds, 4),
                },
            )
            return report
        finally:
            self._loading = False
            self.loading = None

    # --- a coordinated switch: stage, then swap at an instant ---------------------------

    async def stage(self, path: Path, identity: Identity, kind: SnapshotKind) -> float:
        """Prepare a load of ``path`` beside serving and hold it for :meth:`switch` (one at
        a time: a new stage replaces the last). Returns the seconds it took. Refused
        (``EngineRejected``) like a load, with the old weights serving on."""
        with self._one_load(identity):
            started = time.perf_counter()
            self._staged = None
            prepared = await asyncio.to_thread(self._prepare_staged, path, kind)
            self._staged = _Staged(identity, kind, path, prepared, self.swaps)
            log.info("load staged", extra={"snapshot": identity, "path": str(path)})
            return time.perf_counter() - started

    @contextlib.contextmanager
    def _one_load(self, identity: Identity) -> Iterator[None]:
        """Mark a stage or a switch running (``EngineBusy`` while another load runs)."""
        if self._loading:
            raise EngineBusy("another load is running", identity=identity)
        self._loading = True
        self.loading = identity
        try:
            yield
        finally:
            self._loading = False
            self.loading = None

    async def switch(
        self,
        identity: Identity,
        *,
        at: float | None = None,
        cache_policy: KvCachePolicy | None = None,
    ) -> LoadReport:
        """Swap in the load staged for ``identity`` between two tokens, at the wall-clock
        instant ``at`` (Unix seconds; None or past: at once). ``EngineRejected`` when
        nothing is staged for it. Runs to its end even if the caller is cancelled."""
        return await self._to_the_end(self._switch(identity, at, cache_policy))

    async def _switch(
        self, identity: Identity, at: float | None, cache_policy: KvCachePolicy | None
    ) -> LoadReport:
        staged = self._staged
        if staged is None or staged.identity != identity:
            raise EngineRejected(
                "no load is staged for this snapshot",
                expected=identity,
                found=staged.identity if staged else None,
            )
        with self._one_load(identity):
            started = time.perf_counter()
            prepared = staged.prepared
            if staged.swaps != self.swaps:  # built against weights served before
                prepared = await asyncio.to_thread(self._prepare_staged, staged.path, staged.kind)
            if at is not None and (early := at - SWITCH_LOCK_AHEAD_S - time.time()) > 0:
                await asyncio.sleep(early)
            read_done = time.perf_counter()
            self._spare.drop()
            async with self.model_lock, self._storage_lock:
                if at is not None and (wait := at - time.time()) > 0:
                    await asyncio.sleep(wait)
                if prepared.fresh is not None or prepared.merged is not None:
                    self._apply(prepared)  # pointers only: no thread hand-off at the instant
                else:
                    await asyncio.to_thread(self._apply, prepared)
                if cache_policy is not None:
                    self.cache.apply(cache_policy)
                previous, self.identity, self.kind = self.identity, identity, staged.kind
                self._loaded_aliases = prepared.aliases
                self.loaded = True
                self.swaps += 1
                record = SwapRecord(identity, "switch", time.time(), at)
                self.swap_log.append(record)
            self._staged = None
            report = LoadReport(
                identity, staged.kind, read_done - started, time.perf_counter() - read_done
            )
            log.info(
                "staged weights switched in",
                extra={"snapshot": identity, "previous": previous, "at": record.at,
                       "requested_at": at,
                       "late_ms": round((record.at - at) * 1000, 2) if at else None},
            )  # fmt: skip
            return report

    # --- pausing ---------------------------------------------------------------------

    async def pause(self, mode: PauseMode) -> None:
        self._admit.clear()
        if mode is PauseMode.IN_PLACE:
            self._flow.clear()
            async with self.model_lock:
                pass  # a step that was running has finished: everyone is between tokens
            return
        async with self._idle:
            await self._idle.wait_for(lambda: self._active == 0)

    async def resume(self) -> None:
        self._flow.set()
        self._admit.set()

    def reset_cache(self, policy: KvCachePolicy) -> int:
        dropped = self.cache.apply(policy)
        log.info("prompt cache policy applied", extra={"policy": policy.value, "dropped": dropped})
        return dropped

    # --- generation ------------------------------------------------------------------

    def _forward(
        self, model: torch.nn.Module, ids: Sequence[int], kv: DynamicCache | None
    ) -> tuple[torch.Tensor, DynamicCache]:
        with torch.no_grad():
            output = model(
                torch.tensor([list(ids)], dtype=torch.long), past_key_values=kv, use_cache=True
            )
        cache: DynamicCache = output.past_key_values
        return output.logits[0, -1].to(torch.float32), cache

    @staticmethod
    def _choose(
        logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator | None
    ) -> int:
        if request.greedy or request.temperature is None:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits / request.temperature, dim=-1)
        if request.top_p is not None and 0.0 < request.top_p < 1.0:
            ordered, indices = torch.sort(probs, descending=True)
            keep = torch.cumsum(ordered, dim=-1) - ordered < request.top_p
            probs = torch.zeros_like(probs).scatter(0, indices[keep], ordered[keep])
        return int(torch.multinomial(probs, 1, generator=generator).item())

    async def _step(
        self, ids: Sequence[int], kv: DynamicCache | None
    ) -> tuple[torch.Tensor, DynamicCache, str]:
        while True:
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            await self._flow.wait()
            async with self.model_lock:
                if not self._flow.is_set():
                    continue  # paused while we waited for the lock: hold before this token
                logits, cache = await asyncio.to_thread(self._forward, self._serving, ids, kv)
                return logits, cache, self.identity

    async def generate(
        self, request: GenerationRequest, stats: GenerationStats
    ) -> AsyncGenerator[GeneratedToken, None]:
        """Yield tokens one by one; each names the weights that produced it."""
        if not request.prompt:
            raise ValueError("the prompt is empty")
        self._admitting += 1
        try:
            await self._admit.wait()
        finally:
            self._admitting -= 1
        self._active += 1
        try:
            hit = self.cache.lookup(request.session, request.prompt)
            stats.prompt_tokens = len(request.prompt)
            stats.cached_tokens = hit.reused_tokens
            generator = None
            if not request.greedy:
                generator = torch.Generator()
                generator.manual_seed(
                    request.seed if request.seed is not None else int(time.time_ns() % 2**63)
                )
            fed: list[int] = list(request.prompt)
            logits, kv, identity = await self._step(request.prompt[hit.reused_tokens :], hit.kv)
            decoder = tok.StreamDecoder()
            produced = 0
            while True:
                token = self._choose(logits, request, generator)
                produced += 1
                stats.completion_tokens = produced
                if not stats.identities or stats.identities[-1] != identity:
                    stats.identities.append(identity)
                finish: str | None = None
                if token == tok.EOS_ID:
                    finish = "stop"
                elif produced >= request.max_tokens or len(fed) + 1 >= self.max_context:
                    finish = "length"
                text = decoder.feed(token) + (decoder.flush() if finish else "")
                yield GeneratedToken(token, text, identity, finish)
                if finish:
                    break
                fed.append(token)
                logits, kv, identity = await self._step([token], kv)
            self.cache.store(request.session, fed, kv, identity, hit)
        finally:
            self._active -= 1
            async with self._idle:
                self._idle.notify_all()

    # --- debugging -------------------------------------------------------------------

    async def logits(self, token_ids: Sequence[int]) -> tuple[rm.LogitsDigest, str]:
        async with self.model_lock:
            digest = await asyncio.to_thread(rm.logits_digest, self._serving, token_ids)
            return digest, self.identity

    async def weights_digest(self) -> tuple[str, str]:
        async with self.model_lock:
            digest = await asyncio.to_thread(rm.weights_digest, self._serving, self.storage_dtype)
            return digest, self.identity

    async def tensor_digest(self) -> str | None:
        """The served weights' tensor-set digest — ``manifest_digest`` of the snapshot
        they came from when served bit for bit (None for a merged LoRA: its weights are
        no snapshot's). Computed once per swap: from the held bits under the storage lock
        when they are the engine's own copy (generation goes on meanwhile), else under
        the model lock."""
        own_copy = self._storage is not None and self._own_copy
        async with self._storage_lock if own_copy else self.model_lock:
            cached = self._digest
            if cached is not None and cached[0] == self.swaps:
                return cached[1]
            if self.kind is SnapshotKind.LORA:
                value: str | None = None
            else:
                value = await asyncio.to_thread(self._compute_digest)
            self._digest = (self.swaps, value)
            return value

    async def describe_with_digest(self) -> dict[str, Any]:
        """:meth:`describe` and the digest of the same weights.

        The digest waits for the storage lock, which a delta patch holds from its first
        read to its swap: an identity read before that wait and a digest computed after
        it would name the old snapshot with the new one's digest — a sidecar then takes
        the engine for serving other weights than it names and reloads an older buffer
        over the new ones. So the identity is read again whenever a swap landed
        meanwhile."""
        while True:
            described = self.describe()
            digest = await self.tensor_digest()
            if self.swaps == described["swaps"]:
                described["digest"] = digest
                return described

    def _compute_digest(self) -> str:
        held = self._storage
        if held is not None and self._serving is self._base:
            stored = dict(held)  # the exact bits, hashed where they are (no copy)
        else:
            stored = rm.state_for_snapshot(self._serving, self.storage_dtype)
        hashes = {name: _bits_hash(tensor) for name, tensor in stored.items()}
        for alias, canonical in self._loaded_aliases.items():
            hashes[alias] = hashes[canonical]
        return tensor_set_digest(hashes.items())

    def describe(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "instance_id": self.instance_id,
            "loaded": self.loaded,
            "loading": self.loading,
            "kind": self.kind.value,
            "paused": self.paused,
            "active_generations": self._active,
            "waiting_generations": self._admitting,
            "swaps": self.swaps,
            "swap_log": [record.describe() for record in self.swap_log],
            "staged": self._staged.identity if self._staged else None,
            "deltas_applied": self.deltas_applied,
            "storage_dtype": rm.dtype_name(self.storage_dtype),
            "compute_dtype": rm.dtype_name(self.compute_dtype),
        }

    def load_initial(self, path: Path, identity: Identity) -> None:
        """Serve ``path`` (a full snapshot) from the start, before the server listens."""
        prepared = self._prepare(path, SnapshotKind.FULL)
        self._apply(prepared)
        self.identity, self.kind = identity, SnapshotKind.FULL
        self._loaded_aliases = prepared.aliases
        self.loaded = True
