"""What a snapshot holds and how well it compressed, from its manifest (and, for the
changed counts a v3 manifest leaves to ``sparse`` and ``context`` payloads, their
chunk headers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotload.snapshot.codec.tensor_codec import payload_changes
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.manifest import MANIFEST_NAME, CodecId, Manifest, TensorEntry, read_manifest
from hotload.snapshot.paths import inside
from hotload.snapshot.pieces import Piece, pieces

_COUNTED = frozenset((CodecId.SPARSE, CodecId.CONTEXT))


@dataclass(frozen=True)
class TensorSummary:
    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: CodecId
    numel: int
    changed: int | None
    stored_bytes: int
    tensor_bytes: int

    @property
    def changed_fraction(self) -> float | None:
        if self.changed is None:
            return None
        return self.changed / self.numel if self.numel else 0.0


@dataclass(frozen=True)
class SnapshotReport:
    manifest: Manifest
    manifest_bytes: int
    tensors: tuple[TensorSummary, ...]

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data in the rebuilt snapshot."""
        return self.manifest.tensor_bytes()

    @property
    def stored_bytes(self) -> int:
        """Bytes of every file the snapshot stores, manifest included."""
        return self.manifest.stored_bytes() + self.manifest_bytes

    @property
    def ratio(self) -> float:
        """Full tensor bytes / stored bytes (CONTRACTS.md's compression ratio)."""
        return self.tensor_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    @property
    def changed_fraction(self) -> float | None:
        counted = [t for t in self.tensors if t.changed is not None]
        if not counted:
            return None
        numel = sum(t.numel for t in counted)
        return sum(t.changed or 0 for t in counted) / numel if numel else 0.0

    @property
    def removed(self) -> list[str]:
        """Tensors of the previous snapshot this one no longer has."""
        return list(self.manifest.removed)

    def codec_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for tensor in self.tensors:
            counts[tensor.codec.value] = counts.get(tensor.codec.value, 0) + 1
        return counts


def inspect_snapshot(snapshot: Path) -> SnapshotReport:
    """Sizes, ratio, and per tensor the codec chosen and the fraction changed."""
    manifest = read_manifest(snapshot)
    manifest_bytes = (snapshot / MANIFEST_NAME).stat().st_size
    summaries = tuple(
        TensorSummary(
            name=t.name,
            dtype=t.dtype,
            shape=tuple(t.shape),
            codec=t.codec,
            numel=t.numel,
            changed=_changed(snapshot, t),
            stored_bytes=t.nbytes
            if t.codec is CodecId.STORED
            else sum(data.length for data in t.payload_ranges()),
            tensor_bytes=t.nbytes,
        )
        for t in manifest.tensors
    )
    return SnapshotReport(manifest, manifest_bytes, summaries)


def _changed(snapshot: Path, tensor: TensorEntry) -> int | None:
    """The manifest's count, or the payload's own when the manifest leaves it out (for a
    tensor stored as parts, the sum over its parts: None if one of them is unknown)."""
    total = 0
    for piece in pieces(tensor):
        changed = _piece_changed(snapshot, tensor, piece)
        if changed is None:
            return None
        total += changed
    return total


def _piece_changed(snapshot: Path, tensor: TensorEntry, piece: Piece) -> int | None:
    if piece.codec is CodecId.UNCHANGED and tensor.parts is not None:
        return 0
    if piece.changed is not None or piece.codec not in _COUNTED or piece.data is None:
        return piece.changed
    path = inside(snapshot, piece.data.file)
    if not path.is_file():
        return None  # only the manifest is here: the count is unknown
    with path.open("rb") as handle:
        handle.seek(piece.data.offset)
        payload = handle.read(piece.data.length)
    width = DTYPES[tensor.dtype].width
    return payload_changes(
        piece.codec, memoryview(payload), piece.length, width, tensor=tensor.name
    )
