"""One tensor in, one payload out (and back): the codec chosen per tensor by measured size.

The encoder tries the candidates that can plausibly win for the fraction of elements
that changed, measures each payload, and keeps the smallest (ties go to the cheaper
decode: sparse, then dense-sub, dense-xor, raw). A tensor that is new, or whose dtype
or shape changed, is ``raw``; a bit-identical one is ``unchanged`` and stores nothing.

Decoding is split into independent chunk jobs (:func:`plan_decode`), so the caller can
run them on a thread pool: each job writes only its chunk of the output words.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.codec import changes, context, context_kernels, dense, sparse
from hotload.snapshot.codec.context_model import MAX_CLASSES, ContextModel
from hotload.snapshot.codec.jobs import map_jobs
from hotload.snapshot.codec.transforms import apply_changes, zigzag_diff
from hotload.snapshot.limits import DEFAULT_CHUNK_ELEMENTS, MAX_CHUNK_ELEMENTS
from hotload.snapshot.manifest import CodecId

SPARSE_MAX_FRACTION = 0.3
"""Above this fraction of changed elements the sparse form is not even tried."""
DENSE_MIN_FRACTION = 0.02
"""Below it the dense forms are not tried (their zero runs alone outweigh the changes)."""
XOR_MIN_FRACTION = 0.25
"""Below it ``dense-xor`` is not tried (``dense-sub`` wins on small moves)."""
RAW_MIN_FRACTION = 0.6
"""Above it ``raw`` is tried too (a tensor rewritten rather than nudged)."""

_PREFERENCE = (
    CodecId.SPARSE,
    CodecId.CONTEXT,
    CodecId.DENSE_SUB,
    CodecId.DENSE_XOR,
    CodecId.RAW,
)


@dataclass(frozen=True)
class CodecOptions:
    """Encoder settings; none of them changes what a decoder must support."""

    level: int = 3
    """zstd level of every frame."""
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    codecs: tuple[CodecId, ...] = _PREFERENCE
    """Candidates allowed (for experiments and tests); raw is always allowed."""
    context_classes: int = MAX_CLASSES
    """Classes of the ``context`` codec's model; 1 codes changes without context (order 0:
    the exponent of the previous value is not used)."""

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_elements <= MAX_CHUNK_ELEMENTS:
            raise ValueError(f"chunk_elements must be in 1..{MAX_CHUNK_ELEMENTS}")
        if not 1 <= self.context_classes <= MAX_CLASSES:
            raise ValueError(f"context_classes must be in 1..{MAX_CLASSES}")


@dataclass(frozen=True)
class EncodedTensor:
    codec: CodecId
    payload: bytes
    """Empty for ``unchanged``."""
    changed: int | None
    """Elements whose bits differ from the previous tensor (None for ``raw``)."""


class WordBackend(Protocol):
    """Where the words live and how their planes are made (numpy here; torch in
    ``hotload.snapshot.codec.torch_words``). Backends return identical planes for identical
    bits, so the payloads — compressed by the same code — are identical too."""

    def length(self, words: Any) -> int: ...

    def same_layout(self, new: Any, old: Any) -> bool: ...

    def changed(self, new: Any, old: Any) -> int: ...

    def dense_planes(self, codec: CodecId, new: Any, old: Any | None) -> list[np.ndarray]: ...

    def sparse_planes(self, new: Any, old: Any) -> tuple[int, int, list[np.ndarray]]: ...

    def context_inputs(self, new: Any, old: Any) -> context.ContextInputs: ...


class NumpyWords:
    """The numpy backend: 1-D arrays of unsigned words."""

    def length(self, words: np.ndarray) -> int:
        return len(words)

    def same_layout(self, new: np.ndarray, old: np.ndarray) -> bool:
        return bool(old.dtype == new.dtype and len(old) == len(new))

    def changed(self, new: np.ndarray, old: np.ndarray) -> int:
        return int(np.count_nonzero(new != old))

    def dense_planes(
        self, codec: CodecId, new: np.ndarray, old: np.ndarray | None
    ) -> list[np.ndarray]:
        return dense.chunk_planes(codec, new, old)

    def sparse_planes(self, new: np.ndarray, old: np.ndarray) -> tuple[int, int, list[np.ndarray]]:
        return sparse.chunk_planes(new, old)

    def context_inputs(self, new: np.ndarray, old: np.ndarray) -> context.ContextInputs:
        positions = np.flatnonzero(new != old)
        return context.ContextInputs(old, positions, zigzag_diff(new[positions], old[positions]))


NUMPY_WORDS: WordBackend = NumpyWords()


def backend_for(words: Any) -> WordBackend:
    """numpy for arrays; torch (imported now) for anything else."""
    if isinstance(words, np.ndarray):
        return NUMPY_WORDS
    from hotload.snapshot.codec.torch_words import TORCH_WORDS

    return TORCH_WORDS


def encode_tensor(
    new: Any,
    old: Any | None,
    options: CodecOptions = CodecOptions(),
    executor: Executor | None = None,
    backend: WordBackend | None = None,
    *,
    dtype: str | None = None,
    native: bool = True,
    simd: bool = True,
) -> EncodedTensor:
    """Encode ``new`` (1-D words) against ``old`` (same words, or None: no previous).

    Words are numpy arrays of unsigned integers, or torch tensors (any device) viewed
    as integers of the dtype's width; the payload is the same either way. ``dtype`` (the
    safetensors name) says where the exponent is, for the ``context`` codec's classes.

    numpy words take the native path where the kernels are built: one scan per chunk
    finds the changes (:mod:`~hotload.snapshot.codec.changes`) and the ``sparse`` and
    ``context`` candidates are made from them; so do torch words in host memory (viewed
    as numpy words, not copied) unless a ``backend`` is named. ``native=False`` takes the
    reference path (the backend's whole-tensor passes, as torch words on a device always
    do) and ``simd=False`` the native kernels' portable loops: the same bytes every way
    (the tests compare them).
    """
    if backend is None and native and context_kernels.NATIVE and not isinstance(new, np.ndarray):
        hosted = _host_views(new, old)  # torch words in host memory: numpy views of them
        if hosted is not None:
            new, old = hosted
    words = backend or backend_for(new)
    total = words.length(new)
    bounds = dense.chunk_bounds(total, options.chunk_elements)
    size = options.chunk_elements
    level = options.level

    def dense_payload(codec: CodecId) -> bytes:
        def one(bound: tuple[int, int]) -> list[bytes]:
            s, n = bound
            made = words.dense_planes(
                codec, new[s : s + n], None if old is None else old[s : s + n]
            )
            return dense.compress_chunk(made, level)

        return dense.assemble(size, map_jobs(executor, one, bounds))

    if old is None or not words.same_layout(new, old):
        return EncodedTensor(CodecId.RAW, dense_payload(CodecId.RAW), None)
    allowed = set(options.codecs)
    key_shift, key_bits = (0, 0)
    if CodecId.CONTEXT in allowed and options.context_classes > 1:
        key_shift, key_bits = context.key_of(dtype)

    found = None
    if native and context_kernels.NATIVE and isinstance(words, NumpyWords):
        found = changes.scan_tensor(
            new,
            old,
            bounds,
            key_shift=key_shift,
            key_bits=key_bits,
            count_keys=key_bits > 0,
            limit=_sparse_limit(total),
            executor=executor,
            simd=simd,
        )
        changed = found.changed
    else:
        changed = words.changed(new, old)
    if changed == 0:
        return EncodedTensor(CodecId.UNCHANGED, b"", 0)
    fraction = changed / total
    candidates: dict[CodecId, bytes] = {}
    if CodecId.SPARSE in allowed and fraction <= SPARSE_MAX_FRACTION:

        def one_sparse(bound: tuple[int, int]) -> tuple[int, int, list[bytes]]:
            s, n = bound
            return sparse.compress_chunk(words.sparse_planes(new[s : s + n], old[s : s + n]), level)

        def one_found(chunk: changes.ChunkChanges) -> tuple[int, int, list[bytes]]:
            return sparse.compress_changes(chunk.positions, chunk.values, level)

        candidates[CodecId.SPARSE] = sparse.assemble(
            size,
            map_jobs(executor, one_sparse, bounds)
            if found is None
            else map_jobs(executor, one_found, found.chunks),
        )
    if CodecId.CONTEXT in allowed and fraction <= SPARSE_MAX_FRACTION:
        candidates[CodecId.CONTEXT] = _context_payload(
            words, new, old, found, options, executor, dtype=dtype, simd=simd
        )
    del found
    if CodecId.DENSE_SUB in allowed and (fraction >= DENSE_MIN_FRACTION or not candidates):
        candidates[CodecId.DENSE_SUB] = dense_payload(CodecId.DENSE_SUB)
    if CodecId.DENSE_XOR in allowed and (fraction >= XOR_MIN_FRACTION or not candidates):
        candidates[CodecId.DENSE_XOR] = dense_payload(CodecId.DENSE_XOR)
    if fraction >= RAW_MIN_FRACTION or not candidates:
        candidates[CodecId.RAW] = dense_payload(CodecId.RAW)
    best = min(candidates, key=lambda c: (len(candidates[c]), _PREFERENCE.index(c)))
    return EncodedTensor(best, candidates[best], None if best is CodecId.RAW else changed)


def _host_views(new: Any, old: Any | None) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Numpy views of torch words that are in host memory (None when any is not)."""
    from hotload.snapshot.codec.torch_words import host_view

    hosted = host_view(new)
    previous = None if old is None else host_view(old)
    if hosted is None or (old is not None and previous is None):
        return None
    return hosted, previous


def _sparse_limit(total: int) -> int:
    """The most changes of ``total`` elements for which the sparse candidates are tried
    (``changes / total <= SPARSE_MAX_FRACTION``, as the encoder computes it): a scan keeps
    positions only up to here, since past it they would not be used."""
    limit = int(SPARSE_MAX_FRACTION * total)
    while limit < total and (limit + 1) / total <= SPARSE_MAX_FRACTION:
        limit += 1
    while limit > 0 and limit / total > SPARSE_MAX_FRACTION:
        limit -= 1
    return limit


def _context_payload(
    words: WordBackend,
    new: Any,
    old: Any,
    found: changes.TensorChanges | None,
    options: CodecOptions,
    executor: Executor | None,
    *,
    dtype: str | None,
    simd: bool,
) -> bytes:
    """The smaller of the order-0 and the context-modelled payloads (the first on a tie),
    from the scan's changes when there is one, else from the backend's inputs."""
    size = options.chunk_elements
    make: Callable[[int], bytes]
    if found is None:
        inputs = words.context_inputs(new, old)

        def make(classes: int) -> bytes:
            return context.encode(inputs, size, dtype=dtype, classes=classes, executor=executor)

    else:
        scanned = found

        def make(classes: int, model: ContextModel | None = None) -> bytes:
            return context.encode_changes(
                old,
                scanned,
                size,
                dtype=dtype,
                classes=classes,
                executor=executor,
                simd=simd,
                model=model,
            )

        sized = context.order0_length(old, found, size) if options.context_classes > 1 else None
        if sized is not None:  # order 0 written only where it is not longer (a tie: order 0)
            length, model = sized
            modelled = make(options.context_classes)
            return make(1, model) if length <= len(modelled) else modelled
    return min((make(classes) for classes in sorted({1, options.context_classes})), key=len)


@dataclass(frozen=True)
class ChunkJob:
    """One independent piece of a tensor's decode: elements ``[start, start + length)``."""

    codec: CodecId
    chunk: dense.DenseChunk | sparse.SparseChunk | context.ContextChunk
    tensor: str

    @property
    def start(self) -> int:
        return self.chunk.start

    @property
    def length(self) -> int:
        return self.chunk.length

    def changes(self, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(positions in the chunk, zigzag differences) for the codecs that touch only the
        changed elements (``sparse``, ``context``), from the chunk's previous words; None
        for the dense codecs."""
        if isinstance(self.chunk, sparse.SparseChunk):
            if not self.chunk.changes:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=previous.dtype)
            return sparse.decode_changes(self.chunk, tensor=self.tensor)
        if isinstance(self.chunk, context.ContextChunk):
            return context.decode_changes(self.chunk, previous, tensor=self.tensor)
        return None

    def run(self, out: np.ndarray) -> None:
        """Rebuild ``out`` (this chunk's words; previous bits in it unless ``raw``)."""
        if isinstance(self.chunk, dense.DenseChunk):
            dense.decode_chunk(self.codec, self.chunk, out, tensor=self.tensor)
            return
        found = self.changes(out)
        if found is not None and len(found[0]):
            positions, values = found
            try:
                apply_changes(out, positions, values)
            except ValueError as err:
                raise DecodeFailed(str(err), tensor=self.tensor) from None


def plan_decode(
    codec: CodecId,
    payload: memoryview,
    numel: int,
    width: int,
    *,
    tensor: str,
    changed: int | None = None,
) -> list[ChunkJob]:
    """Parse ``payload``'s layout into chunk jobs; :class:`DecodeFailed` if it is malformed.

    ``changed`` (from the manifest) must equal the sparse payload's change count.
    """
    if codec is CodecId.SPARSE:
        sparse_chunks = sparse.parse(payload, numel, width, tensor=tensor)
        total = sum(c.changes for c in sparse_chunks)
        if changed is not None and total != changed:
            raise DecodeFailed(
                "sparse payload changes disagree with the manifest",
                tensor=tensor,
                expected=changed,
                found=total,
            )
        return [ChunkJob(codec, c, tensor) for c in sparse_chunks]
    if codec is CodecId.CONTEXT:
        context_chunks = context.parse(payload, numel, width, tensor=tensor)
        total = sum(c.changes for c in context_chunks)
        if changed is not None and total != changed:
            raise DecodeFailed(
                "context payload changes disagree with the manifest",
                tensor=tensor,
                expected=changed,
                found=total,
            )
        return [ChunkJob(codec, c, tensor) for c in context_chunks]
    if codec in (CodecId.RAW, CodecId.DENSE_XOR, CodecId.DENSE_SUB):
        return [
            ChunkJob(codec, c, tensor) for c in dense.parse(payload, numel, width, tensor=tensor)
        ]
    raise DecodeFailed("codec has no payload", tensor=tensor, codec=str(codec))


def payload_changes(
    codec: CodecId, payload: memoryview, numel: int, width: int, *, tensor: str
) -> int:
    """The changed-element count a ``sparse`` or ``context`` payload declares (its chunk
    headers only; no frame or stream is opened); :class:`DecodeFailed` if malformed."""
    if codec is CodecId.SPARSE:
        return sum(c.changes for c in sparse.parse(payload, numel, width, tensor=tensor))
    if codec is CodecId.CONTEXT:
        return sum(c.changes for c in context.parse(payload, numel, width, tensor=tensor))
    raise DecodeFailed("codec does not count its changes", tensor=tensor, codec=str(codec))


def needs_previous(codec: CodecId) -> bool:
    """Whether the output must start as the previous tensor's bits."""
    return codec in (
        CodecId.UNCHANGED,
        CodecId.SPARSE,
        CodecId.CONTEXT,
        CodecId.DENSE_XOR,
        CodecId.DENSE_SUB,
    )


def decode_tensor(
    codec: CodecId,
    payload: bytes | memoryview,
    out: np.ndarray,
    *,
    tensor: str = "",
    changed: int | None = None,
) -> None:
    """Rebuild ``out`` in place in one thread (previous bits in it for delta codecs)."""
    if codec is CodecId.UNCHANGED:
        return
    for job in plan_decode(
        codec, memoryview(payload), len(out), out.dtype.itemsize, tensor=tensor, changed=changed
    ):
        job.run(out[job.start : job.start + job.length])


def iter_jobs(jobs: Iterable[ChunkJob]) -> Iterator[ChunkJob]:
    yield from jobs
