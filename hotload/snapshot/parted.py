"""Write a snapshot whose tensors are stored as parts (v4), from several writers at once.

A sharded trainer holds each tensor in pieces on different ranks; no rank may gather a
tensor it does not own. Each writer (:class:`PartsWriter`, one per rank) encodes only
the ranges it holds into a payload file of its own (a Full's ranges as they are, a
delta's against the same range of its own previous weights) and reports a
:class:`TensorPart` per range. One place (:func:`write_parted`) then gathers every
writer's parts, checks they cover every tensor exactly once, lays the shards out exactly
as a single process writes the gathered state_dict (the same headers, bytes for bytes),
stores those headers, and writes the manifest last. A replica rebuilds the very bytes a
single-process publish of the gathered weights would give (docs/snapshot-format.md,
"Parts (v4)").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hotload.api import SnapshotKind
from hotload.errors import ConfigError, ManifestInvalid
from hotload.snapshot.codec.frames import compress_bytes
from hotload.snapshot.codec.tensor_codec import CodecOptions, encode_tensor
from hotload.snapshot.digest import bytes_digest
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.encoder import (
    HEADER_LEVEL,
    DeltaWriter,
    EncodeResult,
    references_digest,
    shard_entry,
)
from hotload.snapshot.manifest import (
    FORMAT_PARTS,
    MANIFEST_NAME,
    CodecId,
    Manifest,
    ReferencedFile,
    ShardEntry,
    StoredFile,
    TensorEntry,
    TensorPart,
)
from hotload.snapshot.safetensors_file import build_header
from hotload.snapshot.staging import write_bytes
from hotload.snapshot.state_dict import shard_groups


@dataclass(frozen=True)
class TensorMeta:
    """A tensor of the whole (gathered) state_dict, as every rank knows it."""

    name: str
    dtype: str
    """Safetensors dtype name (``BF16``, ``F32``, …)."""
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].width


class PartsWriter:
    """One writer's payload file: the parts it holds, encoded one after the other."""

    def __init__(
        self,
        directory: Path,
        relpath: str,
        *,
        options: CodecOptions = CodecOptions(),
        executor: Executor | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = DeltaWriter(directory / relpath, relpath)
        self._options = options
        self._executor = executor
        self.relpath = relpath

    def add(
        self,
        dtype: str,
        start: int,
        words: Any,
        previous: Any | None,
        *,
        complete: bool,
    ) -> TensorPart:
        """Encode elements ``[start, start + len(words))`` of a tensor: as they are for a
        Full (``complete``), else against ``previous`` (the same range of the previous
        tensor; None when there is none: ``raw``). ``words`` are flat unsigned words
        (numpy, or torch on any device)."""
        if complete:
            data = self._writer.append(_host_bytes(words))
            return TensorPart(start=start, length=len(words), codec=CodecId.STORED, data=data)
        encoded = encode_tensor(words, previous, self._options, self._executor, dtype=dtype)
        return TensorPart(
            start=start,
            length=len(words),
            codec=encoded.codec,
            data=self._writer.append(encoded.payload) if encoded.payload else None,
            changed=encoded.changed if encoded.codec is not CodecId.RAW else None,
        )

    def close(self) -> StoredFile | None:
        """Finish the file: its entry for the manifest, or None (and no file) if empty."""
        self._writer.close()
        if self._writer.offset == 0:
            self._writer.path.unlink()
            return None
        return StoredFile(
            path=self.relpath,
            size=self._writer.offset,
            hash=bytes_digest(self._writer.path.read_bytes()),
        )


def _host_bytes(words: Any) -> bytes | memoryview:
    if hasattr(words, "cpu"):  # a torch tensor of words
        words = words.cpu().numpy()
    return memoryview(words).cast("B")


def parted_shards(metas: Iterable[TensorMeta], max_shard_bytes: int | None = None) -> Layout:
    """The shard files and their headers, exactly as ``write_state_dict`` lays out the
    gathered state_dict (names sorted, split before ``max_shard_bytes``)."""
    by_name = {meta.name: meta for meta in metas}
    groups = shard_groups([(m.name, m.nbytes) for m in by_name.values()], max_shard_bytes)
    layout: Layout = []
    for relpath, names in groups:
        tensors = [by_name[name] for name in names]
        header, ranges = build_header(
            [(t.name, DTYPES[t.dtype], t.shape) for t in tensors], {"format": "pt"}
        )
        size = 8 + len(header) + (ranges[-1][1] if ranges else 0)
        layout.append((relpath, header, size, tensors))
    return layout


Layout = list[tuple[str, bytes, int, list[TensorMeta]]]
"""(shard path, header bytes, file size, its tensors in order) per shard."""


@dataclass(frozen=True)
class Others:
    """The non-tensor files of the snapshot (config, tokenizer): stored, or referenced."""

    files: list[StoredFile]
    referenced: list[StoredFile]


def write_parted(
    out: Path,
    *,
    identity: str,
    step: int,
    kind: SnapshotKind,
    metas: list[TensorMeta],
    parts: Mapping[str, list[TensorPart]],
    hashes: Mapping[str, str],
    payloads: list[StoredFile],
    others: Others,
    previous: str | None = None,
    previous_digest: str | None = None,
    removed: Iterable[str] = (),
    ignored_config_fields: Iterable[str] = (),
    headers_file: str = "hotload-headers.bin",
) -> EncodeResult:
    """Write the shard headers and, last, the manifest into ``out``, which already holds
    ``others.files`` and this writer's own payload file (the other writers' files are
    wherever they uploaded them: the bucket). ``parts`` are every writer's parts by
    tensor, in any order; ``hashes`` each whole tensor's xxh3-128.

    Refuses (``ManifestInvalid``, naming the tensor) parts that overlap, leave elements
    missing or reach past their tensor, and tensors without a hash."""
    if kind is SnapshotKind.LORA:
        raise ConfigError("a LoRA adapter is never stored as parts", identity=identity)
    headers = DeltaWriter(out / headers_file, headers_file)
    shards: list[ShardEntry] = []
    tensors: list[TensorEntry] = []
    try:
        for relpath, header, size, group in parted_shards(metas):
            stored = headers.append(compress_bytes(header, HEADER_LEVEL))
            shards.append(shard_entry(relpath, header, size, stored))
            tensors += [_entry(meta, relpath, parts, hashes) for meta in group]
    finally:
        headers.close()
    deltas = [
        StoredFile(
            path=headers_file,
            size=headers.offset,
            hash=bytes_digest((out / headers_file).read_bytes()),
        ),
        *payloads,
    ]
    referenced = others.referenced
    try:
        manifest = Manifest(
            format=FORMAT_PARTS,
            identity=identity,
            step=step,
            kind=kind,
            previous=previous,
            previous_digest=previous_digest,
            ignored_config_fields=sorted(set(ignored_config_fields)),
            files=others.files,
            deltas=deltas,
            referenced=[ReferencedFile(path=e.path, size=e.size) for e in referenced],
            referenced_digest=references_digest(referenced),
            removed=sorted(set(removed)),
            shards=shards,
            tensors=tensors,
        )
    except ValidationError as err:
        first = err.errors()[0]
        raise ManifestInvalid(
            "the parts do not make a valid snapshot",
            identity=identity,
            field=".".join(str(p) for p in first.get("loc", ())),
            problem=first.get("msg", ""),
        ) from None
    data = manifest.dumps()
    write_bytes(out / MANIFEST_NAME, data)
    return EncodeResult(
        manifest, out, manifest.tensor_bytes(), manifest.stored_bytes() + len(data), ()
    )


def _entry(
    meta: TensorMeta,
    shard: str,
    parts: Mapping[str, list[TensorPart]],
    hashes: Mapping[str, str],
) -> TensorEntry:
    found = hashes.get(meta.name)
    if found is None:
        raise ManifestInvalid("a tensor has no hash", tensor=meta.name)
    try:
        return TensorEntry(
            name=meta.name,
            dtype=meta.dtype,
            shape=list(meta.shape),
            file=shard,
            codec=CodecId.PARTS,
            hash=found,
            parts=sorted(parts.get(meta.name, []), key=lambda part: (part.start, part.length)),
        )
    except ValidationError as err:
        raise ManifestInvalid(
            "a tensor's parts do not cover it exactly once",
            tensor=meta.name,
            problem=err.errors()[0].get("msg", ""),
        ) from None
