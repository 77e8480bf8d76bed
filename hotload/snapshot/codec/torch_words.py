"""Integer words of torch tensors and their byte planes: the codec's torch backend.

Integer words are signed torch types of the dtype's width (``int16`` for bf16);
wrapping arithmetic is done one size wider and masked, so no result depends on how a
device handles signed overflow. Planes are identical to the numpy backend's for
identical bits. torch is imported when this module is:
:func:`hotload.snapshot.codec.tensor_codec.backend_for` imports it only for torch words.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import torch

from hotload.errors import DecodeFailed
from hotload.snapshot.codec.context import ContextInputs
from hotload.snapshot.codec.sparse import gap_planes_for
from hotload.snapshot.manifest import CodecId

_SIGNED: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_WIDER: Final = {1: torch.int16, 2: torch.int32, 4: torch.int64}


def words_of(tensor: torch.Tensor) -> torch.Tensor:
    """A flat view of ``tensor``'s bits as integer words of its element size."""
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous():
        raise DecodeFailed("tensor is not contiguous", shape=list(tensor.shape))
    return flat.view(_SIGNED[flat.element_size()])


def _unsigned(words: torch.Tensor) -> torch.Tensor:
    """Words as non-negative values in a wider type (width 8 stays int64, wrapping)."""
    width = words.element_size()
    if width == 8:
        return words
    wide = words.to(_WIDER[width])
    return wide & ((1 << (8 * width)) - 1)


def _narrow(wide: torch.Tensor, width: int) -> torch.Tensor:
    """Values in [0, 2**(8*width)) back to words of ``width`` bytes."""
    if width == 8:
        return wide
    if width == 1:
        return wide.to(torch.uint8)
    half = 1 << (8 * width - 1)
    return torch.where(wide >= half, wide - 2 * half, wide).to(_SIGNED[width])


def zigzag(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``zigzag(new - old)`` as non-negative values (int64 bits for width 8)."""
    width = new.element_size()
    if width == 8:
        diff = new - old
        return (diff << 1) ^ (diff >> 63)
    bits = 8 * width
    mask = (1 << bits) - 1
    diff = (_unsigned(new) - _unsigned(old)) & mask
    signed = torch.where(diff >= 1 << (bits - 1), diff - (1 << bits), diff)
    return ((signed << 1) ^ (signed >> (bits - 1))) & mask


def unzigzag_add(old: torch.Tensor, zig: torch.Tensor) -> torch.Tensor:
    """``old + unzigzag(zig)`` as words (wrapping)."""
    width = old.element_size()
    if width == 8:
        return old + (((zig >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(zig & 1))
    mask = (1 << (8 * width)) - 1
    diff = (zig >> 1) ^ -(zig & 1)
    return _narrow((_unsigned(old) + diff) & mask, width)


def planes(values: torch.Tensor, count: int) -> list[np.ndarray]:
    """Byte planes 0..count-1 of ``values`` (any integer type), as host uint8 arrays."""
    if values.dtype == torch.uint8:
        return [values.cpu().numpy()]
    return [((values >> (8 * j)) & 0xFF).to(torch.uint8).cpu().numpy() for j in range(count)]


class TorchWords:
    """The torch backend of :class:`~hotload.snapshot.codec.tensor_codec.WordBackend`."""

    def length(self, words: torch.Tensor) -> int:
        return int(words.numel())

    def same_layout(self, new: torch.Tensor, old: torch.Tensor) -> bool:
        return bool(new.dtype == old.dtype and new.numel() == old.numel())

    def changed(self, new: torch.Tensor, old: torch.Tensor) -> int:
        return int((new != old).sum().item())

    def dense_planes(
        self, codec: CodecId, new: torch.Tensor, old: torch.Tensor | None
    ) -> list[np.ndarray]:
        width = new.element_size()
        if codec is CodecId.RAW:
            values = new
        elif old is None:
            raise ValueError(f"{codec} needs the previous words")
        elif codec is CodecId.DENSE_XOR:
            values = new ^ old
        else:
            values = zigzag(new, old)
        return planes(values, width)

    def sparse_planes(
        self, new: torch.Tensor, old: torch.Tensor
    ) -> tuple[int, int, list[np.ndarray]]:
        positions = torch.nonzero(new != old).reshape(-1)
        changes = int(positions.numel())
        if changes == 0:
            return 0, 0, []
        start = torch.full((1,), -1, dtype=positions.dtype, device=positions.device)
        gaps = torch.diff(positions, prepend=start) - 1
        gap_count = gap_planes_for(int(gaps.max().item()))
        values = zigzag(new[positions], old[positions])
        return changes, gap_count, planes(gaps, gap_count) + planes(values, new.element_size())

    def context_inputs(self, new: torch.Tensor, old: torch.Tensor) -> ContextInputs:
        width = new.element_size()
        positions = torch.nonzero(new != old).reshape(-1)
        values = host_words(_narrow(zigzag(new[positions], old[positions]), width), width)
        return ContextInputs(
            host_words(old, width), positions.cpu().numpy().astype(np.int64), values
        )


def host_view(words: torch.Tensor) -> np.ndarray | None:
    """Words in host memory as unsigned numpy words sharing their memory (no copy);
    None for words on a device."""
    if words.device.type != "cpu":
        return None
    view: np.ndarray = words.numpy().view(np.dtype(f"u{words.element_size()}"))
    return view


def host_words(words: torch.Tensor, width: int) -> np.ndarray:
    """Words on the host as unsigned numpy words. The context codec's classes come from
    the previous words, so for it 2 bytes per bf16 element cross to the host, not only
    the changes."""
    return words.cpu().numpy().view(np.dtype(f"u{width}"))


TORCH_WORDS: Final = TorchWords()
