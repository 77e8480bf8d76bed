"""Read-only access to the tensors of safetensors files as numpy words, through mmap.

The codec sees a tensor as a flat array of unsigned words (its bit patterns), viewed
straight out of the mapped file: nothing is copied to read it.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hotload.errors import DecodeFailed
from hotload.snapshot.digest import tensor_hash, tensor_set_digest
from hotload.snapshot.mapping import mapped
from hotload.snapshot.safetensors_file import SafetensorsHeader, TensorInfo, read_header


@dataclass(frozen=True)
class MappedShard:
    relpath: str
    header: SafetensorsHeader
    buffer: mmap.mmap

    def words(self, tensor: TensorInfo) -> np.ndarray:
        """The tensor's bits as a read-only flat array of unsigned words."""
        if tensor.numel == 0:
            return np.zeros(0, dtype=tensor.dtype.word)
        return np.frombuffer(
            self.buffer, dtype=tensor.dtype.word, count=tensor.numel, offset=tensor.begin
        )

    def raw(self, tensor: TensorInfo) -> memoryview:
        return memoryview(self.buffer)[tensor.begin : tensor.end]


class ShardSource(Protocol):
    """One shard of tensors: its header, and each tensor's words and bytes."""

    @property
    def header(self) -> SafetensorsHeader: ...

    def words(self, tensor: TensorInfo) -> Any: ...

    def raw(self, tensor: TensorInfo) -> Any: ...


class TensorSource(Protocol):
    """Tensors by shard and by name: a directory's mapped files, or a torch state_dict."""

    @property
    def shards(self) -> Mapping[str, ShardSource]: ...

    @property
    def by_name(self) -> Mapping[str, tuple[ShardSource, TensorInfo]]: ...

    def digest(self) -> str: ...


@dataclass(frozen=True)
class TensorIndex:
    """Every tensor of a directory's shards, by name."""

    shards: dict[str, MappedShard]
    by_name: dict[str, tuple[MappedShard, TensorInfo]]

    def words(self, name: str) -> np.ndarray:
        shard, info = self.by_name[name]
        return shard.words(info)

    def digest(self) -> str:
        """:func:`tensor_set_digest` of every tensor, hashing each one."""
        return tensor_set_digest(
            (name, tensor_hash(shard.raw(info))) for name, (shard, info) in self.by_name.items()
        )


@contextmanager
def mapped_shards(root: Path, relpaths: tuple[str, ...] | list[str]) -> Iterator[TensorIndex]:
    """Map ``root``'s shards read-only; tensor names must be unique across them."""
    with ExitStack() as stack:
        shards: dict[str, MappedShard] = {}
        by_name: dict[str, tuple[MappedShard, TensorInfo]] = {}
        for relpath in relpaths:
            path = root / relpath
            header = read_header(path)
            handle = stack.enter_context(path.open("rb"))
            buffer = stack.enter_context(mapped(handle.fileno(), 0))
            if len(buffer) != header.file_size:
                raise DecodeFailed("file changed while it was read", file=relpath)
            shard = MappedShard(relpath, header, buffer)
            shards[relpath] = shard
            for tensor in header.tensors:
                if tensor.name in by_name:
                    raise DecodeFailed("a tensor name appears in two shards", tensor=tensor.name)
                by_name[tensor.name] = (shard, tensor)
        yield TensorIndex(shards, by_name)
