"""Write snapshots: Full (a Hugging Face directory), LoRA (a PEFT adapter), Incremental.

An incremental snapshot holds, per shard of the current weights, one delta file with
every changed tensor's payload (and the shard's header when it changed), plus the
non-tensor files that changed; unchanged files are referenced (one hash over them all).
The manifest is written last, then the directory is renamed into place
(docs/snapshot-format.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hotload.api import SnapshotKind
from hotload.api.kinds import Identity
from hotload.errors import ConfigError
from hotload.snapshot.codec.frames import compress_bytes
from hotload.snapshot.codec.tensor_codec import CodecOptions, encode_tensor
from hotload.snapshot.digest import bytes_digest, file_digest, referenced_digest, tensor_hash
from hotload.snapshot.layout import CONFIG, ModelDir, check_config_change, scan
from hotload.snapshot.manifest import (
    FORMAT,
    FORMAT_CHECKPOINT,
    MANIFEST_NAME,
    ByteRange,
    CodecId,
    FileHash,
    Manifest,
    ManifestCheckpoint,
    ReferencedFile,
    ShardEntry,
    StoredFile,
    TensorEntry,
)
from hotload.snapshot.staging import copy_file, staged_directory, write_bytes
from hotload.snapshot.tensor_files import TensorSource, mapped_shards

log = logging.getLogger(__name__)

_COUNTED = frozenset((CodecId.SPARSE, CodecId.CONTEXT))
"""Codecs whose payload holds the changed count: the manifest leaves it out (v3)."""

HEADER_LEVEL = 19
"""zstd level for stored shard headers (small, very repetitive JSON)."""


@dataclass(frozen=True)
class TensorReport:
    """What the encoder did with one tensor."""

    name: str
    dtype: str
    numel: int
    codec: CodecId
    changed: int | None
    stored_bytes: int


@dataclass(frozen=True)
class EncodeResult:
    manifest: Manifest
    path: Path
    tensor_bytes: int
    """Bytes of tensor data in the full snapshot (the ratio's numerator)."""
    stored_bytes: int
    """Bytes of every file this snapshot stores, the manifest included."""
    tensors: tuple[TensorReport, ...]

    @property
    def ratio(self) -> float:
        """Compression ratio as CONTRACTS.md defines it (full tensor bytes / stored bytes)."""
        return self.tensor_bytes / self.stored_bytes if self.stored_bytes else float("inf")


def encode(
    previous: Path | None,
    current: Path,
    out: Path,
    *,
    identity: Identity,
    step: int,
    previous_identity: Identity | None = None,
    ignored_config_fields: Iterable[str] = (),
    options: CodecOptions = CodecOptions(),
    threads: int = 1,
    checkpoint: ManifestCheckpoint | None = None,
) -> EncodeResult:
    """Write the snapshot of ``current`` into ``out`` (which must not exist, or be empty).

    ``current`` with ``adapter_config.json`` is a LoRA (always complete); with no
    ``previous`` a Full; else an Incremental against ``previous`` (a model directory
    holding the weights of snapshot ``previous_identity``), naming ``checkpoint`` (v5)
    when one is given.
    """
    ignored = sorted(set(ignored_config_fields))
    model = scan(current)
    if model.is_lora or previous is None:
        kind = SnapshotKind.LORA if model.is_lora else SnapshotKind.FULL
        if previous is not None:
            log.info(
                "a LoRA adapter is always complete: previous ignored", extra={"snapshot": identity}
            )
        return _write_complete(model, out, identity=identity, step=step, kind=kind, ignored=ignored)
    if previous_identity is None:
        raise ConfigError("an incremental snapshot needs previous_identity", identity=identity)
    before = scan(previous)
    if before.is_lora:
        raise ConfigError("a delta cannot apply to a LoRA adapter", previous=str(previous))
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        with (
            mapped_shards(before.root, before.shards) as old,
            mapped_shards(model.root, model.shards) as new,
        ):
            return write_incremental(
                before,
                model,
                old,
                new,
                out,
                identity=identity,
                step=step,
                previous_identity=previous_identity,
                ignored=ignored,
                options=options,
                pool=pool,
                checkpoint=checkpoint,
            )
    finally:
        if pool is not None:
            pool.shutdown()


def encode_full(
    current: Path,
    out: Path,
    *,
    identity: Identity,
    step: int,
    ignored_config_fields: Iterable[str] = (),
) -> EncodeResult:
    """Write a Full (or, for an adapter directory, LoRA) snapshot of ``current``."""
    return encode(
        None,
        current,
        out,
        identity=identity,
        step=step,
        ignored_config_fields=ignored_config_fields,
    )


def _stored(path: Path, relpath: str) -> StoredFile:
    return StoredFile(
        path=relpath, size=path.stat().st_size, hash=file_digest(path, FileHash.SHA256)
    )


def _write_complete(
    model: ModelDir,
    out: Path,
    *,
    identity: Identity,
    step: int,
    kind: SnapshotKind,
    ignored: list[str],
) -> EncodeResult:
    with staged_directory(out) as staging:
        files = []
        for relpath in (*model.shards, *model.others):
            copy_file(model.path(relpath), staging / relpath)
            files.append(_stored(staging / relpath, relpath))
        shards: list[ShardEntry] = []
        tensors: list[TensorEntry] = []
        with mapped_shards(staging, model.shards) as index:
            for relpath, shard in index.shards.items():
                shards.append(
                    shard_entry(relpath, shard.header.header_bytes, shard.header.file_size, None)
                )
                for info in shard.header.tensors:
                    tensors.append(
                        TensorEntry(
                            name=info.name,
                            dtype=info.dtype.name,
                            shape=list(info.shape),
                            file=relpath,
                            codec=CodecId.STORED,
                            hash=tensor_hash(shard.raw(info)),
                        )
                    )
        manifest = Manifest(
            identity=identity,
            step=step,
            kind=kind,
            ignored_config_fields=ignored,
            files=files,
            shards=shards,
            tensors=tensors,
        )
        manifest_bytes = manifest.dumps()
        write_bytes(staging / MANIFEST_NAME, manifest_bytes)
    reports = tuple(
        TensorReport(t.name, t.dtype, t.numel, t.codec, None, t.nbytes) for t in manifest.tensors
    )
    return EncodeResult(
        manifest,
        out,
        manifest.tensor_bytes(),
        manifest.stored_bytes() + len(manifest_bytes),
        reports,
    )


def shard_entry(
    relpath: str, header_bytes: bytes, size: int, stored: ByteRange | None
) -> ShardEntry:
    return ShardEntry(
        path=relpath,
        size=size,
        header_length=len(header_bytes),
        header_hash=tensor_hash(header_bytes),
        header=stored,
    )


class DeltaWriter:
    """Appends payloads to one delta file and remembers where each one went."""

    def __init__(self, path: Path, relpath: str) -> None:
        self.path = path
        self.relpath = relpath
        self.handle = path.open("wb")
        self.offset = 0

    def append(self, payload: bytes | memoryview) -> ByteRange:
        self.handle.write(payload)
        byte_range = ByteRange(file=self.relpath, offset=self.offset, length=len(payload))
        self.offset += len(payload)
        return byte_range

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


def delta_file_name(index: int) -> str:
    return f"hotload-delta-{index:05d}.bin"


def write_incremental(
    before: ModelDir,
    model: ModelDir,
    old: TensorSource,
    new: TensorSource,
    out: Path,
    *,
    identity: Identity,
    step: int,
    previous_identity: Identity,
    ignored: list[str],
    options: CodecOptions,
    pool: ThreadPoolExecutor | None,
    previous_digest: str | None = None,
    store_headers: bool = False,
    checkpoint: ManifestCheckpoint | None = None,
) -> EncodeResult:
    """The incremental snapshot from ``old`` to ``new`` tensors; non-tensor files from
    ``before`` and ``model`` (their ``others``). ``store_headers`` stores every shard
    header (when the previous directory's header bytes are not known). ``checkpoint``:
    the chain's newest checkpoint, named in a v5 manifest."""
    with staged_directory(out) as staging:
        files, referenced = copy_changed_others(before, model, staging, ignored)
        previous_digest = previous_digest or old.digest()
        deltas, shards, tensors, reports = _encode_shards(
            old, new, staging, options, pool, store_headers
        )
        manifest = Manifest(
            format=FORMAT_CHECKPOINT if checkpoint is not None else FORMAT,
            checkpoint=checkpoint,
            identity=identity,
            step=step,
            kind=SnapshotKind.INCREMENTAL,
            previous=previous_identity,
            previous_digest=previous_digest,
            ignored_config_fields=ignored,
            files=files,
            deltas=deltas,
            referenced=[ReferencedFile(path=e.path, size=e.size) for e in referenced],
            referenced_digest=references_digest(referenced),
            removed=sorted(set(old.by_name) - {t.name for t in tensors}),
            shards=shards,
            tensors=tensors,
        )
        manifest_bytes = manifest.dumps()
        write_bytes(staging / MANIFEST_NAME, manifest_bytes)
    stored = manifest.stored_bytes() + len(manifest_bytes)
    log.info(
        "incremental snapshot written",
        extra={"snapshot": identity, "previous": previous_identity, "stored_bytes": stored},
    )
    return EncodeResult(manifest, out, manifest.tensor_bytes(), stored, tuple(reports))


def copy_changed_others(
    before: ModelDir | None, model: ModelDir, staging: Path, ignored: list[str]
) -> tuple[list[StoredFile], list[StoredFile]]:
    """The non-tensor files of ``model`` (config, tokenizer): those that changed since
    ``before`` (all of them without one) are copied into ``staging`` (first list); the
    others are referenced (second). A changed ``config.json`` must differ only in the
    ``ignored`` fields (``ManifestInvalid`` otherwise)."""
    files: list[StoredFile] = []
    referenced: list[StoredFile] = []
    for relpath in model.others:
        source = model.path(relpath)
        entry = _stored(source, relpath)
        if before is not None and relpath in before.others:
            if _stored(before.path(relpath), relpath) == entry:
                referenced.append(entry)
                continue
            if relpath == CONFIG:
                check_config_change(before.path(relpath), source, ignored)
        copy_file(source, staging / relpath)
        files.append(entry)
    return files, referenced


def references_digest(referenced: list[StoredFile]) -> str | None:
    """v3's ``referencedDigest`` of the referenced files (None when there are none)."""
    if not referenced:
        return None
    return referenced_digest((e.path, e.size, e.hash) for e in referenced)


def _encode_shards(
    old: TensorSource,
    new: TensorSource,
    staging: Path,
    options: CodecOptions,
    pool: ThreadPoolExecutor | None,
    store_headers: bool,
) -> tuple[list[StoredFile], list[ShardEntry], list[TensorEntry], list[TensorReport]]:
    deltas: list[StoredFile] = []
    shards: list[ShardEntry] = []
    tensors: list[TensorEntry] = []
    reports: list[TensorReport] = []
    for number, (relpath, shard) in enumerate(new.shards.items(), start=1):
        writer = DeltaWriter(staging / delta_file_name(number), delta_file_name(number))
        try:
            header = shard.header
            previous_shard = old.shards.get(relpath)
            stored_header = None
            if (
                store_headers
                or previous_shard is None
                or previous_shard.header.header_bytes != header.header_bytes
            ):
                stored_header = writer.append(compress_bytes(header.header_bytes, HEADER_LEVEL))
            shards.append(
                shard_entry(relpath, header.header_bytes, header.file_size, stored_header)
            )
            for info in header.tensors:
                words = shard.words(info)
                before = old.by_name.get(info.name)
                previous_words = None
                if (
                    before is not None
                    and before[1].dtype == info.dtype
                    and before[1].shape == info.shape
                ):
                    previous_words = before[0].words(before[1])
                encoded = encode_tensor(words, previous_words, options, pool, dtype=info.dtype.name)
                del previous_words
                data = writer.append(encoded.payload) if encoded.payload else None
                tensors.append(
                    TensorEntry(
                        name=info.name,
                        dtype=info.dtype.name,
                        shape=list(info.shape),
                        file=relpath,
                        codec=encoded.codec,
                        hash=tensor_hash(shard.raw(info)),
                        data=data,
                        changed=None if encoded.codec in _COUNTED else encoded.changed,
                    )
                )
                reports.append(
                    TensorReport(
                        info.name,
                        info.dtype.name,
                        info.numel,
                        encoded.codec,
                        encoded.changed,
                        len(encoded.payload),
                    )
                )
                del words
        finally:
            writer.close()
        if writer.offset == 0:
            writer.path.unlink()
        else:
            deltas.append(
                StoredFile(
                    path=writer.relpath,
                    size=writer.offset,
                    hash=bytes_digest(writer.path.read_bytes()),
                )
            )
    return deltas, shards, tensors, reports
