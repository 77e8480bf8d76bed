"""Rebuild a full model directory from a snapshot (and, for a delta, the previous one).

Order of checks, so that nothing is trusted before it is verified: the manifest parses
within its limits; every stored file has its size and sha256; the previous directory is
the one the delta was made against (its record or its tensors' digest); each shard's
header has its declared hash and agrees with the manifest's tensor list; each payload's
layout fits its tensor before any frame is opened; each frame declares exactly the size
the layout implies; each rebuilt tensor has its xxh3-128. Everything is written into a
temporary sibling of ``out`` that is renamed only when complete, and removed on error.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotload.api import SnapshotKind
from hotload.errors import ChainBroken, DecodeFailed
from hotload.snapshot.codec.tensor_codec import ChunkJob, needs_previous
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.digest import file_digest, referenced_digest, tensor_hash, tensor_set_digest
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.in_place import (
    can_patch_in_place,
    rebuild_in_place,
    record_bytes,
    stored_header,
)
from hotload.snapshot.layout import CONFIG, REBUILT_NAME, check_config_change, scan
from hotload.snapshot.limits import DEFAULT_CHUNK_ELEMENTS
from hotload.snapshot.manifest import (
    CodecId,
    Manifest,
    ShardEntry,
    TensorEntry,
    read_manifest,
)
from hotload.snapshot.mapping import mapped
from hotload.snapshot.paths import inside
from hotload.snapshot.pieces import pieces, plan_piece, read_payload, stored_words, uses_previous
from hotload.snapshot.safetensors_file import SafetensorsHeader, length_prefix, parse_header
from hotload.snapshot.shard_checks import (
    check_complete_shards,
    check_tensor_hash,
    check_tensors_match,
    entries_by_shard,
)
from hotload.snapshot.staging import copy_file, staged_directory, write_bytes
from hotload.snapshot.tensor_files import MappedShard, TensorIndex, mapped_shards
from hotload.snapshot.verifier import verify_stored_files
from hotload.space import reserve

log = logging.getLogger(__name__)

PENDING_PAYLOAD_BYTES = 64 * 1024 * 1024
"""Encoded bytes read ahead of the decode threads, per rebuild."""


@dataclass(frozen=True)
class RebuildResult:
    manifest: Manifest
    path: Path
    tensor_bytes: int
    """Bytes of tensor data rebuilt (and verified)."""
    files: int
    """Files in the rebuilt directory."""


def read_rebuilt_record(directory: Path) -> dict[str, object] | None:
    """The decoder's record in a rebuilt directory, or None if there is none."""
    path = directory / REBUILT_NAME
    if not path.is_file() or path.stat().st_size > 64 * 1024:
        return None
    try:
        record = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _record(manifest: Manifest, digest: str) -> bytes:
    return record_bytes(manifest, digest)


def rebuild(
    previous: Path | None,
    snapshot: Path,
    out: Path,
    *,
    threads: int = 1,
    verify_previous: bool = False,
    consume_previous: bool = False,
    stored_verified: bool = False,
    check: Callable[[], None] | None = None,
) -> RebuildResult:
    """Rebuild the full directory of ``snapshot`` into ``out`` (absent or empty), verified.

    ``previous`` is the rebuilt directory of the delta's previous snapshot (ignored for
    Full and LoRA). ``threads`` decode chunks in parallel; memory beyond the output is
    one chunk per thread. ``verify_previous`` hashes the previous tensors even when the
    previous directory carries the decoder's record of what it holds.

    ``consume_previous`` lets the decoder patch the previous directory's files in place
    and rename it to ``out`` (docs/snapshot-format.md, "Rebuilding in place"): much
    faster, and ``previous`` is gone afterwards — unless the rebuild fails, which
    restores it exactly. It applies when every shard keeps its path and header;
    otherwise the rebuild is a fresh copy as without it.

    ``stored_verified`` says the caller has just checked every stored file of ``snapshot``
    against this manifest (the sidecar's verify phase), so they are not hashed twice;
    every rebuilt tensor is still checked against its hash.

    ``check`` is called before each tensor (and each copied file): it raises to stop the
    rebuild (a cancelled load), which then cleans up as after any failure — a fresh
    rebuild leaves nothing, an in-place one gives the previous directory back.
    """
    check = check or _go_on
    manifest = read_manifest(snapshot)
    if not stored_verified:
        verify_stored_files(snapshot, manifest)
    digest = tensor_set_digest((t.name, t.hash) for t in manifest.tensors)
    incremental = manifest.kind is SnapshotKind.INCREMENTAL
    if incremental and previous is None:
        raise ChainBroken(
            "an incremental snapshot needs its previous snapshot",
            identity=manifest.identity,
            previous=manifest.previous,
        )
    in_place = consume_previous and previous is not None and incremental
    if in_place and previous is not None and can_patch_in_place(previous, snapshot, manifest):
        _check_previous_directory(previous, manifest, verify_previous)
        rebuild_in_place(previous, snapshot, out, manifest, _record(manifest, digest), check)
        files = sum(1 for p in out.rglob("*") if p.is_file())
        log.info(
            "snapshot rebuilt in place",
            extra={"snapshot": manifest.identity, "out": str(out)},
        )
        return RebuildResult(manifest, out, manifest.tensor_bytes(), files)
    with staged_directory(out) as staging:
        if incremental and previous is not None:
            _rebuild_incremental(
                previous, snapshot, staging, manifest, threads, verify_previous, check
            )
        elif manifest.has_parts:
            _rebuild_parted(snapshot, staging, manifest, threads, check)
        else:
            _rebuild_complete(snapshot, staging, manifest, check)
        write_bytes(staging / REBUILT_NAME, _record(manifest, digest))
        files = sum(1 for p in staging.rglob("*") if p.is_file())
    log.info(
        "snapshot rebuilt",
        extra={"snapshot": manifest.identity, "kind": manifest.kind.value, "out": str(out)},
    )
    return RebuildResult(manifest, out, manifest.tensor_bytes(), files)


def _go_on() -> None:
    """The default ``check``: never stop."""


def _rebuild_complete(
    snapshot: Path, staging: Path, manifest: Manifest, check: Callable[[], None]
) -> None:
    for entry in manifest.files:
        check()
        copy_file(inside(snapshot, entry.path), inside(staging, entry.path))
    with mapped_shards(staging, [s.path for s in manifest.shards]) as index:
        check_complete_shards(index, manifest)


def _check_previous(previous: Path, manifest: Manifest, index: TensorIndex, verify: bool) -> None:
    record = read_rebuilt_record(previous)
    if record is not None and not manifest.builds_on(str(record.get("identity"))):
        raise ChainBroken(
            "the previous directory holds another snapshot",
            identity=manifest.identity,
            expected=manifest.previous,
            found=record.get("identity"),
        )
    if record is not None and not verify and isinstance(record.get("tensorDigest"), str):
        digest = record["tensorDigest"]
    else:
        digest = index.digest()
    if digest != manifest.previous_digest:
        raise ChainBroken(
            "the previous directory's tensors are not the ones this delta was made against",
            identity=manifest.identity,
            previous=manifest.previous,
        )
    dropped = set(index.by_name) - {t.name for t in manifest.tensors}
    if dropped != set(manifest.removed):
        raise ChainBroken(
            "the delta's removed tensors are not the ones the previous snapshot has",
            identity=manifest.identity,
            unexpected=sorted(dropped ^ set(manifest.removed))[:5],
        )


def _check_referenced(previous: Path, manifest: Manifest) -> None:
    """Every referenced file is in the previous directory with its size and hash: each
    against its own hash (v1/v2) or all of them against ``referencedDigest`` (v3)."""
    found: list[tuple[str, int, str]] = []
    for entry in manifest.referenced:
        source = inside(previous, entry.path)
        if not source.is_file() or source.stat().st_size != entry.size:
            raise ChainBroken(
                "a file the delta references is missing or of another size in the previous "
                "directory",
                identity=manifest.identity,
                file=entry.path,
            )
        digest = file_digest(source, manifest.file_hash)
        if entry.hash is not None and digest != entry.hash:
            raise ChainBroken(
                "a file the delta references differs in the previous directory",
                identity=manifest.identity,
                file=entry.path,
            )
        found.append((entry.path, entry.size, digest))
    expected = manifest.referenced_digest
    if expected is not None and referenced_digest(found) != expected:
        raise ChainBroken(
            "the files the delta references differ in the previous directory",
            identity=manifest.identity,
            files=[path for path, _, _ in found][:5],
        )


def _check_previous_directory(previous: Path, manifest: Manifest, verify: bool) -> None:
    """The checks of the previous directory a rebuild makes before touching anything."""
    _check_referenced(previous, manifest)
    before = scan(previous)
    with mapped_shards(previous, before.shards) as old:
        _check_previous(previous, manifest, old, verify)


def _rebuild_incremental(
    previous: Path,
    snapshot: Path,
    staging: Path,
    manifest: Manifest,
    threads: int,
    verify_previous: bool,
    check: Callable[[], None],
) -> None:
    before = scan(previous)
    _check_referenced(previous, manifest)
    for referenced in manifest.referenced:
        copy_file(inside(previous, referenced.path), inside(staging, referenced.path))
    for entry in manifest.files:
        target = inside(staging, entry.path)
        copy_file(inside(snapshot, entry.path), target)
        if entry.path == CONFIG and CONFIG in before.others:
            check_config_change(before.path(CONFIG), target, manifest.ignored_config_fields)
    with mapped_shards(previous, before.shards) as old:
        _check_previous(previous, manifest, old, verify_previous)
        _rebuild_shards(old, snapshot, staging, manifest, threads, check)


def _rebuild_parted(
    snapshot: Path, staging: Path, manifest: Manifest, threads: int, check: Callable[[], None]
) -> None:
    """A Full whose tensors are stored as parts (v4): its files as they are, its shards
    rebuilt from their stored headers and their tensors' parts (nothing previous)."""
    for entry in manifest.files:
        check()
        copy_file(inside(snapshot, entry.path), inside(staging, entry.path))
    _rebuild_shards(TensorIndex({}, {}), snapshot, staging, manifest, threads, check)


def _rebuild_shards(
    old: TensorIndex,
    snapshot: Path,
    staging: Path,
    manifest: Manifest,
    threads: int,
    check: Callable[[], None],
) -> None:
    entries = entries_by_shard(manifest)
    with ExitStack() as stack:
        deltas = DeltaFiles(snapshot, manifest, stack)
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        try:
            for shard_entry in manifest.shards:
                _rebuild_shard(
                    old,
                    deltas,
                    staging,
                    manifest,
                    shard_entry,
                    entries.get(shard_entry.path, {}),
                    pool,
                    check,
                )
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)


def _shard_header(
    old: TensorIndex, deltas: DeltaFiles, entry: ShardEntry, manifest: Manifest
) -> bytes:
    if entry.header is None:
        previous_shard = old.shards.get(entry.path)
        if previous_shard is None:
            raise ChainBroken(
                "the delta reuses a shard header the previous snapshot does not have",
                identity=manifest.identity,
                file=entry.path,
            )
        header_bytes = previous_shard.header.header_bytes
        if (
            len(header_bytes) != entry.header_length
            or tensor_hash(header_bytes) != entry.header_hash
        ):
            raise ChainBroken(
                "the previous snapshot's shard header is not the one the delta reuses",
                identity=manifest.identity,
                file=entry.path,
            )
        return header_bytes
    return stored_header(deltas, entry, manifest)


Task = Callable[[], None]


def _rebuild_shard(
    old: TensorIndex,
    deltas: DeltaFiles,
    staging: Path,
    manifest: Manifest,
    entry: ShardEntry,
    entries: dict[str, TensorEntry],
    pool: ThreadPoolExecutor | None,
    check: Callable[[], None],
) -> None:
    header_bytes = _shard_header(old, deltas, entry, manifest)
    header = parse_header(header_bytes, entry.size, source=entry.path)
    check_tensors_match(header, entries, entry.path)
    target = inside(staging, entry.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w+b") as handle:
        handle.truncate(entry.size)
        # Claimed now: a page first written through the map on a full tmpfs is a SIGBUS.
        reserve(handle.fileno(), entry.size)
        with mapped(handle.fileno(), entry.size, writable=True) as output:
            output[: header.data_start] = length_prefix(header_bytes) + header_bytes
            _fill_tensors(old, deltas, manifest, header, entries, output, pool, check)
            output.flush()
        os.fsync(handle.fileno())


def _fill_tensors(
    old: TensorIndex,
    deltas: DeltaFiles,
    manifest: Manifest,
    header: SafetensorsHeader,
    entries: dict[str, TensorEntry],
    output: mmap.mmap,
    pool: ThreadPoolExecutor | None,
    check: Callable[[], None],
) -> None:
    """Decode every tensor of one shard into ``output``, hashing each as it completes.

    Payloads are read one tensor at a time; at most ``PENDING_PAYLOAD_BYTES`` of them
    wait in the pool at once, so memory beyond the output stays bounded.
    """
    pending: deque[tuple[TensorEntry, int, int, int, list[Future[None]]]] = deque()
    pending_bytes = 0
    view = memoryview(output)
    try:

        def drain_one() -> int:
            tensor, begin, end, size, futures = pending.popleft()
            for future in futures:
                future.result()
            check_tensor_hash(tensor, view[begin:end], manifest)
            return size

        for info in header.tensors:
            check()
            tensor = entries[info.name]
            tasks, size = _tensor_tasks(old, manifest, tensor, output, info.begin, deltas)
            pending.append((tensor, info.begin, info.end, size, [_submit(pool, t) for t in tasks]))
            pending_bytes += size
            while len(pending) > 1 and pending_bytes > PENDING_PAYLOAD_BYTES:
                pending_bytes -= drain_one()
        while pending:
            drain_one()
    finally:
        for *_, futures in pending:
            for future in futures:
                future.cancel()
            for future in futures:
                if not future.cancelled():
                    future.exception()
        pending.clear()
        view.release()


def _submit(pool: ThreadPoolExecutor | None, task: Task) -> Future[None]:
    if pool is not None:
        return pool.submit(task)
    future: Future[None] = Future()
    try:
        task()
    except BaseException as err:
        future.set_exception(err)
    else:
        future.set_result(None)
    return future


def _tensor_tasks(
    old: TensorIndex,
    manifest: Manifest,
    tensor: TensorEntry,
    output: mmap.mmap,
    begin: int,
    deltas: DeltaFiles,
) -> tuple[list[Task], int]:
    """The tasks that rebuild one tensor at ``begin`` of ``output`` (each writes its own
    range), and the bytes of payload they hold."""
    dtype = DTYPES[tensor.dtype]
    if tensor.numel == 0:
        return [], 0
    source: tuple[MappedShard, int] | None = None
    if uses_previous(tensor):
        found = old.by_name.get(tensor.name)
        if found is None:
            raise ChainBroken(
                "a delta names a tensor the previous snapshot does not have",
                identity=manifest.identity,
                tensor=tensor.name,
            )
        shard, info = found
        if info.dtype.name != tensor.dtype or info.shape != tuple(tensor.shape):
            raise DecodeFailed(
                "a delta's tensor has another dtype or shape than the previous one",
                tensor=tensor.name,
                expected=f"{tensor.dtype}{tensor.shape}",
                found=f"{info.dtype.name}{list(info.shape)}",
            )
        source = (shard, info.begin)
    word = dtype.word
    tasks: list[Task] = []
    held = 0

    def words_at(start: int, length: int) -> np.ndarray:
        return np.frombuffer(output, dtype=word, count=length, offset=begin + start * dtype.width)

    for piece in pieces(tensor):
        payload = read_payload(deltas, piece)
        held += 0 if payload is None else len(payload)
        if piece.codec is CodecId.STORED and payload is not None:
            words = stored_words(tensor, piece, payload)

            def copy(words: np.ndarray = words, start: int = piece.start) -> None:
                np.copyto(words_at(start, len(words)), words)

            tasks.append(copy)
            continue
        jobs: list[ChunkJob | None]
        if payload is None:
            spans = [
                (s, min(DEFAULT_CHUNK_ELEMENTS, piece.length - s))
                for s in range(0, piece.length, DEFAULT_CHUNK_ELEMENTS)
            ]
            jobs = [None] * len(spans)
        else:
            planned = plan_piece(tensor, piece, payload)
            jobs = list(planned)
            spans = [(job.start, job.length) for job in planned]
        keep = needs_previous(piece.codec)
        for job, (start, length) in zip(jobs, spans, strict=True):
            start += piece.start

            def task(
                job: ChunkJob | None = job,
                start: int = start,
                length: int = length,
                keep: bool = keep,
            ) -> None:
                out = words_at(start, length)
                if source is not None and keep:
                    shard, previous = source
                    np.copyto(
                        out,
                        np.frombuffer(
                            shard.buffer,
                            dtype=word,
                            count=length,
                            offset=previous + start * dtype.width,
                        ),
                    )
                if job is not None:
                    job.run(out)

            tasks.append(task)
    return tasks, held
