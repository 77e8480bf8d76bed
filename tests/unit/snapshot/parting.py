"""Parted snapshots (v4) written from model directories as N writers would write them.

``write_parted_snapshot`` plays every rank of a sharded trainer in one process: each
tensor's rows are split among ``writers`` the way ``torch.chunk`` (FSDP's ``Shard(0)``)
splits them, each writer encodes only its rows into its own payload file (against the
same rows of the previous model for a delta), and :func:`hotload.snapshot.parted.
write_parted` gathers the parts. The golden vectors and the parts tests use it.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import numpy as np

from hotload.api import SnapshotKind
from hotload.snapshot import EncodeResult
from hotload.snapshot.codec.tensor_codec import CodecOptions
from hotload.snapshot.digest import tensor_hash
from hotload.snapshot.encoder import copy_changed_others
from hotload.snapshot.layout import scan
from hotload.snapshot.manifest import TensorPart
from hotload.snapshot.parted import Others, PartsWriter, TensorMeta, write_parted
from hotload.snapshot.tensor_files import TensorIndex, mapped_shards


def row_ranges(shape: tuple[int, ...], writers: int) -> list[tuple[int, int]]:
    """Each writer's element range: ``torch.chunk`` of the rows (the last writers may get
    none), every element of a 0-d tensor to the first."""
    numel = int(np.prod(shape)) if shape else 1
    if not shape or shape[0] == 0:
        return [(0, numel)] + [(numel, numel)] * (writers - 1)
    rows = shape[0]
    row = numel // rows
    chunk = -(-rows // writers)
    return [(min(w * chunk, rows) * row, min((w + 1) * chunk, rows) * row) for w in range(writers)]


def write_parted_snapshot(
    previous: Path | None,
    current: Path,
    out: Path,
    *,
    identity: str,
    step: int,
    previous_identity: str | None = None,
    writers: int = 3,
    options: CodecOptions = CodecOptions(),
    ignored_config_fields: tuple[str, ...] = (),
) -> EncodeResult:
    """The parted snapshot of ``current``: a Full without ``previous``, else a delta."""
    model = scan(current)
    before = scan(previous) if previous is not None else None
    out.mkdir(parents=True)
    files, referenced = copy_changed_others(before, model, out, list(ignored_config_fields))
    with ExitStack() as stack:
        new = stack.enter_context(mapped_shards(current, model.shards))
        old = (
            stack.enter_context(mapped_shards(previous, before.shards))
            if previous is not None and before is not None
            else TensorIndex({}, {})
        )
        outputs = [
            PartsWriter(out, f"hotload-parts-{w:05d}.bin", options=options) for w in range(writers)
        ]
        parts: dict[str, list[TensorPart]] = {}
        metas: list[TensorMeta] = []
        hashes: dict[str, str] = {}
        for name, (shard, info) in sorted(new.by_name.items()):
            metas.append(TensorMeta(name, info.dtype.name, info.shape))
            hashes[name] = tensor_hash(shard.raw(info))
            words = shard.words(info)
            found = old.by_name.get(name)
            before_words = None
            if found is not None and (found[1].dtype, found[1].shape) == (info.dtype, info.shape):
                before_words = found[0].words(found[1])
            parts[name] = [
                outputs[w].add(
                    info.dtype.name,
                    start,
                    words[start:stop],
                    None if before_words is None else before_words[start:stop],
                    complete=previous is None,
                )
                for w, (start, stop) in enumerate(row_ranges(info.shape, writers))
                if stop > start
            ]
        payloads = [entry for entry in (w.close() for w in outputs) if entry is not None]
        return write_parted(
            out,
            identity=identity,
            step=step,
            kind=SnapshotKind.FULL if previous is None else SnapshotKind.INCREMENTAL,
            metas=metas,
            parts=parts,
            hashes=hashes,
            payloads=payloads,
            others=Others(files, referenced),
            previous=previous_identity,
            previous_digest=old.digest() if previous is not None else None,
            removed=sorted(set(old.by_name) - set(new.by_name)),
            ignored_config_fields=ignored_config_fields,
        )
