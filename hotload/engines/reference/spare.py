"""The parameters of the step before, kept to take the next delta sparsely.

An engine that computes in another dtype than the snapshot's (float32 on CPU) cannot
patch its parameters in place while they serve, and widening every patched tensor into
a new one rewrites the whole model (577 MB for 144M parameters) to change ~2% of it. So
when a delta swaps the parameters, the tensors they pointed at before are kept as the
*spare*, one step behind, with the ranges that delta wrote. The next delta then brings
the spare forward by writing only the elements the two deltas changed (the previous
one's ranges and its own), widened from the held bits that the patch just checked, and
the parameters are pointed at it: the write is a few percent of the model, and the
memory is the one extra copy the swap held transiently before.

The spare is exact by construction: it equalled the held bits two steps ago, and every
element that differs since is in one of the two deltas' ranges, written from the held
bits (which the patch checked against the manifest). Anything that replaces the
parameters otherwise (a directory load, a LoRA merge) drops it; a tensor the spare lacks
is widened whole.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import torch

log = logging.getLogger(__name__)

try:
    from hotload.engines.reference import _spare

    NATIVE: Final = True
    """Whether the scattered widening runs in C (``_spare.c``), else in numpy."""
except ImportError:  # pragma: no cover - depends on how the checkout was installed
    NATIVE = False  # type: ignore[misc]
    log.warning(
        "the reference engine's native spare kernel is not built: deltas bring the spare "
        "forward with numpy (slower; pip install the package, or python setup.py "
        "build_ext --inplace)"
    )


@dataclass(frozen=True)
class WrittenRange:
    """Elements a patch wrote in one tensor: ``positions`` (in the range) or, when None,
    all of ``[start, start + length)``."""

    start: int
    length: int
    positions: np.ndarray | None


@dataclass
class WrittenElements:
    """Per tensor, the ranges a patch wrote (told by ``patch_tensors``' ``on_change``)."""

    ranges: dict[str, list[WrittenRange]] = field(default_factory=dict)

    def heard(self, name: str, start: int, positions: np.ndarray | None, length: int) -> None:
        """A :data:`hotload.snapshot.patching.ChangeSink`."""
        self.ranges.setdefault(name, []).append(WrittenRange(start, length, positions))

    def count(self) -> int:
        """Elements written (whole ranges counted whole)."""
        return sum(
            written.length if written.positions is None else len(written.positions)
            for ranges in self.ranges.values()
            for written in ranges
        )


def _copy_ranges(
    target: torch.Tensor, source: torch.Tensor, ranges: list[WrittenRange], *, native: bool
) -> None:
    """``target[i] = source[i]`` widened (exact), for every element of ``ranges``.

    bf16 is float32's upper half: widening is a 16-bit shift of the bits, done on the
    words. Natively, range by range (the decoder's per-chunk uint32 positions as they
    are); else the positions are gathered flat for one numpy scatter."""
    flat_target = target.view(-1)
    flat_source = source.reshape(-1)
    widen_words = source.dtype == torch.bfloat16 and target.dtype == torch.float32
    words = flat_source.view(torch.int16).numpy().view(np.uint16) if widen_words else None
    out = flat_target.view(torch.int32).numpy().view(np.uint32) if widen_words else None
    if words is not None and out is not None and native:
        for written in ranges:
            if written.positions is None:
                end = written.start + written.length
                np.left_shift(
                    words[written.start : end],
                    np.uint32(16),
                    out=out[written.start : end],
                    dtype=np.uint32,
                )
                continue
            positions = np.ascontiguousarray(
                written.positions,
                dtype=np.uint32 if written.positions.dtype == np.uint32 else np.int64,
            )
            _spare.widen_bf16_at(
                out.data, words.data, positions.data, written.start, positions.dtype.itemsize
            )
        return
    with torch.no_grad():
        for written in ranges:
            if written.positions is None:
                end = written.start + written.length
                flat_target[written.start : end].copy_(flat_source[written.start : end])
        sparse = [
            written.positions.astype(np.int64, copy=False) + written.start
            for written in ranges
            if written.positions is not None and len(written.positions)
        ]
        if not sparse:
            return
        positions = np.concatenate(sparse)
        if words is not None and out is not None:
            out[positions] = words[positions].astype(np.uint32) << np.uint32(16)
            return
        index = torch.from_numpy(positions)
        flat_target[index] = flat_source[index].to(target.dtype)


WHOLE_FRACTION: Final = 0.25 if NATIVE else 0.04
"""Above this share of a tensor's elements written by the last two deltas, the spare's
tensor is rewritten whole (a sequential pass, ~0.65 ns an element on one core) rather
than element by element. Measured on this machine (144M-element bf16 → float32, sorted
uniform positions): numpy's scattered writes cost ~17 ns each (break-even ~4%); the
native loop is memory-bound, 0.44 ns per element of the tensor at 4% written and
0.52 ns at 16%, still under the whole pass: so with it, only a tensor a quarter
rewritten is widened whole."""


def _widen_whole(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target = source`` widened (exact), in place, on the calling thread alone."""
    if source.dtype == torch.bfloat16 and target.dtype == torch.float32:
        words = source.reshape(-1).view(torch.int16).numpy().view(np.uint16)
        out = target.view(-1).view(torch.int32).numpy().view(np.uint32)
        np.left_shift(words, np.uint32(16), out=out, dtype=np.uint32)
        return
    with torch.no_grad():
        target.copy_(source.view_as(target))


class CatchUp:
    """One delta's bringing forward of the spare, tensor by tensor: each tensor once its
    held bits are final (patched and checked, or not in the delta)."""

    def __init__(
        self,
        spare: Mapping[str, torch.Tensor],
        behind: WrittenElements,
        written: WrittenElements,
        dtype: torch.dtype,
    ) -> None:
        self._spare = spare
        self._behind = behind
        self._written = written
        self._dtype = dtype
        self.fresh: dict[str, torch.Tensor] = {}
        """The new parameters made so far, by name."""

    def tensor(self, name: str, held: torch.Tensor) -> None:
        """Make ``fresh[name]``, equal to ``held`` in the compute dtype: the spare's tensor
        with the elements the last two deltas wrote, or ``held`` widened whole when the
        spare lacks it."""
        spare = self._spare.get(name)
        if spare is None or spare.shape != held.shape or spare.dtype != self._dtype:
            self.fresh[name] = held.to(self._dtype)
            return
        ranges = [*self._behind.ranges.get(name, ()), *self._written.ranges.get(name, ())]
        count = sum(r.length if r.positions is None else len(r.positions) for r in ranges)
        if count > WHOLE_FRACTION * held.numel():
            _widen_whole(spare, held)
        else:
            _copy_ranges(spare, held, ranges, native=NATIVE)
        self.fresh[name] = spare


class SpareParameters:
    """Compute-dtype tensors one step behind the served parameters, and what they lack."""

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self._behind = WrittenElements()

    def drop(self) -> None:
        """Forget the spare (the parameters were replaced otherwise than by a delta)."""
        self._tensors = {}
        self._behind = WrittenElements()

    @property
    def held(self) -> int:
        """How many tensors the spare holds (0 after :meth:`drop`)."""
        return len(self._tensors)

    def start(self, written: WrittenElements, dtype: torch.dtype) -> CatchUp:
        """Hand the spare to one delta's :class:`CatchUp` (``written``: what that delta
        writes, filled while it patches). The spare is consumed: it is empty until
        :meth:`keep` hands it the replaced parameters after the swap, so a patch that
        fails midway, having written part of it, leaves none behind."""
        catch_up = CatchUp(self._tensors, self._behind, written, dtype)
        self.drop()
        return catch_up

    def catch_up(
        self, storage: Mapping[str, torch.Tensor], written: WrittenElements, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        """Tensors of ``dtype`` equal to ``storage`` (the held bits, already patched with
        ``written``), tensor after tensor (:meth:`start`)."""
        catch_up = self.start(written, dtype)
        for name, held in storage.items():
            catch_up.tensor(name, held)
        return catch_up.fresh

    def keep(self, replaced: Mapping[str, torch.Tensor], written: WrittenElements) -> None:
        """After the swap: ``replaced`` (what the parameters pointed at before, the step
        before ``written``) becomes the spare, behind by ``written``."""
        self._tensors = {name: tensor.detach() for name, tensor in replaced.items()}
        self._behind = written
