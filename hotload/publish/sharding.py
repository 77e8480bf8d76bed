"""What one rank of a sharded trainer holds of a state_dict, and what it publishes of it.

``capture_held`` runs in the training loop's thread, on every rank at the same point
(it may exchange tensors with the other ranks, so the order matters): for each tensor of
the state_dict it finds the rank's own contiguous block of rows — a DTensor's local
shard (``Shard(0)``, FSDP2's placement, as it is; ``Shard(d)`` for ``d > 0`` first
exchanged point to point within its mesh dimension's group so that each rank holds
whole rows, never a whole tensor) — and decides whether this rank is the one that
publishes it: a block replicated over some mesh dimensions is published by the rank at
coordinate 0 along each of them; a plain tensor (or a DTensor replicated everywhere),
held whole by every rank, by one rank chosen so that the bytes each rank publishes are
balanced, the same choice on every rank. The blocks kept are copied to host memory in
the snapshot's dtype, so the optimizer may move the live tensors at once.

Only :mod:`torch` and :mod:`torch.distributed` are needed here; they are imported when
this module is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from hotload.errors import ConfigError
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.parted import TensorMeta
from hotload.snapshot.torch_dtypes import safetensors_dtype


@dataclass(frozen=True)
class HeldBlock:
    """Rows ``[start, start + length)`` of the flattened tensor ``name`` (elements), held
    by this rank and published by it."""

    name: str
    start: int
    data: torch.Tensor
    """The block on the host, flat and contiguous, in the snapshot's dtype."""

    @property
    def length(self) -> int:
        return int(self.data.numel())

    def words(self) -> np.ndarray:
        """The block's bits as unsigned words (a view, no copy)."""
        word = DTYPES[safetensors_dtype(self.data).name].word
        return self.data.view(torch.uint8).numpy().view(word)


@dataclass(frozen=True)
class HeldWeights:
    """One rank's share of a state_dict: every tensor's name, dtype and global shape (the
    same on every rank), and the blocks this rank publishes."""

    metas: tuple[TensorMeta, ...]
    blocks: tuple[HeldBlock, ...]


def capture_held(
    state_dict: Mapping[str, Any],
    dtype: torch.dtype | None,
    *,
    member: int,
    members: int,
) -> HeldWeights:
    """This rank's blocks of ``state_dict`` (see the module docstring)."""
    if not state_dict:
        raise ConfigError("the state_dict is empty")
    metas: list[TensorMeta] = []
    blocks: list[HeldBlock] = []
    whole: list[tuple[str, torch.Tensor, torch.dtype]] = []
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError("a state_dict maps names to tensors", tensor=name)
        # Converted to the snapshot's dtype in the one copy to the host (a DTensor's
        # conversion first would copy every local shard twice while the loop waits).
        target = dtype or tensor.dtype
        metas.append(TensorMeta(name, _dtype_name(target), tuple(int(d) for d in tensor.shape)))
        if isinstance(tensor, DTensor) and not _replicated_everywhere(tensor):
            block = _row_block(name, tensor, target)
            if block is not None:
                blocks.append(block)
        else:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            whole.append((name, local, target))
    for name, tensor, target in _balanced(whole, members)[member]:
        blocks.append(HeldBlock(name, 0, _host(tensor, target)))
    return HeldWeights(tuple(metas), tuple(blocks))


def _dtype_name(dtype: torch.dtype) -> str:
    return safetensors_dtype(torch.empty(0, dtype=dtype)).name


def _replicated_everywhere(tensor: DTensor) -> bool:
    return all(isinstance(p, Replicate) for p in tensor.placements)


def _balanced(
    tensors: list[tuple[str, torch.Tensor, torch.dtype]], members: int
) -> list[list[tuple[str, torch.Tensor, torch.dtype]]]:
    """Tensors every rank holds whole, shared among the ranks: largest first (in the
    snapshot's dtype), each to the rank with the fewest bytes so far (ties: the lowest
    rank); the same on every rank."""
    shares: list[list[tuple[str, torch.Tensor, torch.dtype]]] = [[] for _ in range(members)]
    loads = [0] * members
    order = sorted(tensors, key=lambda item: (-item[1].numel() * item[2].itemsize, item[0]))
    for name, tensor, target in order:
        rank = min(range(members), key=lambda r: (loads[r], r))
        shares[rank].append((name, tensor, target))
        loads[rank] += tensor.numel() * target.itemsize
    return shares


def _host(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy on the host in ``dtype``, flat (one pass: conversion and copy together)."""
    return tensor.detach().to(device="cpu", dtype=dtype, copy=True).contiguous().reshape(-1)


def _row_block(name: str, tensor: DTensor, dtype: torch.dtype) -> HeldBlock | None:
    """This rank's rows of a sharded DTensor, or None when another rank publishes them
    (it is not at coordinate 0 of a mesh dimension the block is replicated over) or it
    holds none (an uneven split leaves the last ranks without rows)."""
    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None  # not part of the tensor's mesh
    for placement in tensor.placements:
        if not isinstance(placement, (Shard, Replicate)):
            raise ConfigError(
                "a DTensor to publish is sharded or replicated (reduce partial ones first)",
                tensor=name,
                placement=str(placement),
            )
    local = tensor.to_local()
    row_offset = _row_offset(tensor)
    for dim, placement in enumerate(tensor.placements):
        if isinstance(placement, Shard) and placement.dim > 0:
            local = local.to(dtype)  # trade the snapshot's bytes, not the trainer's
            local, within = _rows_from_columns(local, placement.dim, mesh.get_group(dim))
            row_offset += within
    owner = all(
        coordinate[dim] == 0
        for dim, placement in enumerate(tensor.placements)
        if isinstance(placement, Replicate)
    )
    if not owner or local.numel() == 0:
        return None
    row = math.prod(tensor.shape[1:])
    return HeldBlock(name, row_offset * row, _host(local, dtype))


def _row_offset(tensor: DTensor) -> int:
    """The first global row of this rank's block along dimension 0 (its ``Shard(0)``
    mesh dimensions, nested in mesh order, as DTensor splits them)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if tensor.ndim == 0:
        return 0
    _, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return int(offset[0])


def _chunks(size: int, parts: int) -> list[tuple[int, int]]:
    """``torch.chunk``'s split of ``size`` into ``parts`` (the last ones may be empty)."""
    step = -(-size // parts) if size else 0
    return [(min(i * step, size), min((i + 1) * step, size)) for i in range(parts)]


def _rows_from_columns(
    local: torch.Tensor, dim: int, group: dist.ProcessGroup
) -> tuple[torch.Tensor, int]:
    """Trade column blocks for row blocks within ``group`` (a mesh dimension that splits
    tensor dimension ``dim``): each member sends every other member the rows that member
    will hold of its columns, and gets its own rows of everyone's columns, joined along
    ``dim``. Point to point, so no member ever holds more than its own block twice (an
    all-to-all; gloo has none, and DTensor's fallback gathers the whole tensor).
    Returns the member's rows and where they start among the group's rows."""
    size = dist.get_world_size(group)
    me = dist.get_rank(group)
    widths: list[Any] = [None] * size
    dist.all_gather_object(widths, int(local.shape[dim]), group=group)
    rows = _chunks(int(local.shape[0]), size)
    mine = rows[me]
    received: list[torch.Tensor] = []
    ops: list[dist.P2POp] = []
    for peer in range(size):
        shape = list(local.shape)
        shape[0] = mine[1] - mine[0]
        shape[dim] = int(widths[peer])
        if peer == me:
            received.append(local[mine[0] : mine[1]].contiguous())
            continue
        buffer = torch.empty(shape, dtype=local.dtype, device=local.device)
        received.append(buffer)
        start, stop = rows[peer]
        global_peer = dist.get_global_rank(group, peer)
        ops.append(dist.P2POp(dist.isend, local[start:stop].contiguous(), global_peer, group))
        ops.append(dist.P2POp(dist.irecv, buffer, global_peer, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return torch.cat(received, dim=dim), mine[0]
