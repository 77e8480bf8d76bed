"""One rank's own directory in a sharded publish: the blocks it published last, kept as
the base of its next delta, and the payload files it is writing.

A rank keeps two things apart: the *committed* base (the blocks of the last snapshot
whose manifest was written, named in ``base.json``) and the *candidate* (the blocks of
the round under way). The candidate becomes the base only when the coordinator says
the round committed; a failed round, or a rank killed before it heard, leaves the base
where it was, so the next round's delta is against the last committed snapshot — or,
when a rank's base is not that snapshot's (a rank that lost its directory, a job
restarted with another sharding), the coordinator publishes a Full.

Layout: ``base.json``; ``blocks/<identity>/model.safetensors`` (each block a flat
tensor named after its tensor) and ``blocks/<identity>/starts.json``;
``encoded/<identity>/`` (this rank's payload file while it is uploaded).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from hotload.publish.sharding import HeldBlock
from hotload.publish.state import WorkDir
from hotload.snapshot.state_dict import write_state_dict
from hotload.snapshot.tensor_files import TensorIndex, mapped_shards
from hotload.snapshot.torch_dtypes import safetensors_dtype

BASE_FILE: Final = "base.json"
STARTS_FILE: Final = "starts.json"


class Base(BaseModel):
    """The committed blocks: which snapshot, and their layout's digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    identity: str
    layout: str


def layout_digest(blocks: tuple[HeldBlock, ...] | list[HeldBlock]) -> str:
    """sha256 of what the blocks are (tensor, range, dtype), not of their bits: two
    rounds with the same digest can be a delta of one another, block by block."""
    rows = sorted((b.name, b.start, b.length, safetensors_dtype(b.data).name) for b in blocks)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


class RankDir:
    """A rank's directory (locked while its publisher lives)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = WorkDir(root)
        self._lock.lock()

    def close(self) -> None:
        self._lock.unlock()

    def encoded(self, identity: str) -> Path:
        return self.root / "encoded" / identity

    def base(self) -> Base | None:
        """The committed base, or None (none yet, or its blocks are gone)."""
        try:
            base = Base.model_validate_json((self.root / BASE_FILE).read_text())
        except (OSError, ValidationError):
            return None
        if not (self._blocks(base.identity) / STARTS_FILE).is_file():
            return None
        return base

    def save_candidate(self, identity: str, blocks: tuple[HeldBlock, ...]) -> None:
        """Keep this round's blocks (not yet the base)."""
        directory = self._blocks(identity)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        write_state_dict({b.name: b.data for b in blocks}, directory)
        starts = {b.name: b.start for b in blocks}
        _write_atomic(directory / STARTS_FILE, json.dumps(starts).encode())

    def promote(self, identity: str, layout: str) -> None:
        """The round committed: its blocks are the base; older blocks and files go."""
        _write_atomic(
            self.root / BASE_FILE, Base(identity=identity, layout=layout).model_dump_json().encode()
        )
        self.forget(keep=identity)

    def forget(self, keep: str | None = None) -> None:
        """Drop every encoded file, and every candidate but the committed base (and
        ``keep``)."""
        base = self.base()
        kept = {name for name in (keep, base.identity if base else None) if name}
        blocks = self.root / "blocks"
        if blocks.is_dir():
            for child in blocks.iterdir():
                if child.name not in kept:
                    shutil.rmtree(child, ignore_errors=True)
        shutil.rmtree(self.root / "encoded", ignore_errors=True)

    @contextmanager
    def previous(self, base: Base | None) -> Iterator[PreviousBlocks]:
        """The committed base's blocks, mapped read-only (none without a base)."""
        if base is None:
            yield PreviousBlocks(TensorIndex({}, {}), {})
            return
        directory = self._blocks(base.identity)
        starts = json.loads((directory / STARTS_FILE).read_text())
        shards = [p.name for p in directory.glob("*.safetensors")]
        with mapped_shards(directory, shards) as index:
            yield PreviousBlocks(index, starts)

    def _blocks(self, identity: str) -> Path:
        return self.root / "blocks" / identity


class PreviousBlocks:
    """The base's blocks by tensor name."""

    def __init__(self, index: TensorIndex, starts: dict[str, int]) -> None:
        self._index = index
        self._starts = starts

    def words(self, block: HeldBlock) -> np.ndarray | None:
        """The base's words of exactly this block (same tensor, range and dtype), or None."""
        found = self._index.by_name.get(block.name)
        if found is None or self._starts.get(block.name) != block.start:
            return None
        shard, info = found
        if info.numel != block.length or info.dtype.name != safetensors_dtype(block.data).name:
            return None
        return shard.words(info)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
