"""Check a snapshot directory against its manifest without rebuilding it.

:func:`verify` checks what a reader can check from the snapshot alone: every stored
file's size and hash, every payload's layout against its tensor or part (no frame
opened), and for a Full or LoRA stored whole every shard header and tensor hash.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from hotload.api import SnapshotKind
from hotload.errors import ChecksumMismatch
from hotload.snapshot.delta_files import DeltaFiles
from hotload.snapshot.digest import check_file
from hotload.snapshot.manifest import Manifest, read_manifest
from hotload.snapshot.paths import inside
from hotload.snapshot.pieces import check_layouts
from hotload.snapshot.shard_checks import check_complete_shards
from hotload.snapshot.tensor_files import mapped_shards


@dataclass(frozen=True)
class VerifyResult:
    manifest: Manifest
    files: int
    bytes: int


def verify_stored_files(snapshot: Path, manifest: Manifest) -> VerifyResult:
    """Every file the manifest stores is present with its size and hash, else a typed error."""
    total = 0
    entries = (*manifest.files, *manifest.deltas)
    for entry in entries:
        path = inside(snapshot, entry.path)
        if not path.is_file():
            raise ChecksumMismatch(
                "a file the manifest lists is missing",
                snapshot=manifest.identity,
                file=entry.path,
                expected=entry.size,
                found="missing",
            )
        check_file(path, entry, manifest.file_hash, snapshot=manifest.identity)
        total += entry.size
    return VerifyResult(manifest, len(entries), total)


def verify(snapshot: Path) -> VerifyResult:
    """Verify the snapshot directory ``snapshot``; a typed error names the first problem."""
    manifest = read_manifest(snapshot)
    result = verify_stored_files(snapshot, manifest)
    if manifest.kind is SnapshotKind.INCREMENTAL or manifest.has_parts:
        with ExitStack() as stack:
            deltas = DeltaFiles(snapshot, manifest, stack)
            for tensor in manifest.tensors:
                check_layouts(tensor, deltas.read)
        return result
    with mapped_shards(snapshot, [s.path for s in manifest.shards]) as index:
        check_complete_shards(index, manifest)
    return result
