"""The manifest: the one file that makes a snapshot exist, and the truth about it.

``hotload-manifest.json`` is written last into ``<prefix>/<identity>/``; a reader that
finds it may fetch every file it lists. The model here is the byte-level spec's schema
(docs/snapshot-format.md, "The manifest") in pydantic: camelCase on the wire, unknown
fields refused, every path checked by :func:`~hotload.snapshot.paths.safe_relpath`,
every cross-reference (tensor → shard, tensor data → delta file, ranges inside their
files) checked at parse time, so the decoder never follows a dangling or hostile name.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from hotload.api import SnapshotKind
from hotload.api.formats import (
    FORMAT_V1,
    FORMAT_V2,
    FORMAT_V3,
    FORMAT_V4,
    FORMAT_V5,
    READABLE_FORMATS,
)
from hotload.api.formats import FileHash as FileHash
from hotload.api.identity import ValidIdentity
from hotload.api.kinds import Identity
from hotload.errors import ManifestInvalid, SizeLimitExceeded, UnsafePath
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.limits import (
    MAX_DIMS,
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    MAX_NAME_BYTES,
    MAX_PARTS,
    MAX_TENSOR_BYTES,
    MAX_TENSORS,
)
from hotload.snapshot.manifest_codec import dump_document, load_document
from hotload.snapshot.paths import safe_relpath

MANIFEST_NAME: Final = "hotload-manifest.json"
"""Written last into every snapshot prefix: no manifest, no snapshot."""

FORMAT: Final = FORMAT_V3
"""The format and version we write for a snapshot without parts; also the CRD's
``incremental.compressionFormat`` of such a snapshot."""

FORMAT_PARTS: Final = FORMAT_V4
"""The format of a snapshot whose tensors are stored as parts (a sharded trainer's): the
first that has them, so a reader of v3 refuses such a snapshot instead of misreading it."""

FORMAT_CHECKPOINT: Final = FORMAT_V5
"""The format of a delta that names a checkpoint (``Manifest.checkpoint``): v4's rules and
that key, so a reader of v4 refuses the delta instead of walking past the checkpoint."""

PARTED_FORMATS: Final = (FORMAT_V4, FORMAT_V5)
"""Formats in which tensors may be stored as parts."""

FORMATS: Final = READABLE_FORMATS
"""Every format and version a reader accepts (``hotload.api.formats``, which the operator
judges declarations against)."""

TENSOR_HASH: Final = "xxh3-128"
"""The only rebuilt-tensor hash of v1."""


class CodecId(StrEnum):
    """How one tensor's bytes are stored (docs/snapshot-format.md, "Codecs")."""

    STORED = "stored"
    """Full and LoRA: the tensor sits as-is in its safetensors file."""
    UNCHANGED = "unchanged"
    """Bit-identical to the previous tensor of the same name: nothing stored."""
    RAW = "raw"
    """New tensor (or new shape/dtype): byte planes of its bits, zstd per chunk."""
    DENSE_XOR = "dense-xor"
    """Bitwise XOR with the previous bits, byte planes, zstd per chunk."""
    DENSE_SUB = "dense-sub"
    """Zigzag of the wrapping difference with the previous bits, byte planes, zstd."""
    SPARSE = "sparse"
    """Changed positions (gaps) and zigzag differences, byte planes, zstd per chunk."""
    CONTEXT = "context"
    """v2: changes Golomb-coded per class of the previous value's exponent."""
    PARTS = "parts"
    """v4: the tensor is stored as parts (contiguous ranges of its flattened elements),
    each with its own codec and payload, possibly in different delta files."""


PAYLOAD_CODECS: Final = frozenset(
    (CodecId.RAW, CodecId.DENSE_XOR, CodecId.DENSE_SUB, CodecId.SPARSE, CodecId.CONTEXT)
)
"""Codecs whose tensor (or part) has an encoded payload."""
COMPLETE_PART_CODECS: Final = frozenset((CodecId.STORED, CodecId.RAW))
"""What a part of a Full may use: it has no previous tensor."""


_HEX = {
    FileHash.SHA256: r"^[0-9a-f]{64}$",
    FileHash.ADLER32: r"^[0-9a-f]{8}$",
}
_XXH3_HEX = r"^[0-9a-f]{32}$"
_UNSAFE_PATH = "unsafe_path"


def _checked_path(value: str) -> str:
    try:
        return safe_relpath(value)
    except UnsafePath as err:
        raise PydanticCustomError(_UNSAFE_PATH, str(err)) from err


SafePath = Annotated[str, AfterValidator(_checked_path)]
Size = Annotated[int, Field(ge=0, le=MAX_TENSOR_BYTES * 64)]
Xxh3Hex = Annotated[str, Field(pattern=_XXH3_HEX)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class StoredFile(_Model):
    """A file stored under the snapshot's prefix (or, when referenced, under the previous)."""

    path: SafePath
    size: Size
    hash: Annotated[str, Field(pattern=r"^[0-9a-f]{8}([0-9a-f]{56})?$")]
    """Hex digest in the manifest's ``fileHash`` family."""


class ReferencedFile(_Model):
    """A file of the rebuilt snapshot unchanged since the previous one, not stored here.

    v1/v2 give each its sha256 (``hash``); v3 gives none and commits to all of them at
    once with the manifest's ``referencedDigest`` (docs/snapshot-format.md, §4).
    """

    path: SafePath
    size: Size
    hash: Annotated[str, Field(pattern=r"^[0-9a-f]{8}([0-9a-f]{56})?$")] | None = None


class ByteRange(_Model):
    """Bytes ``[offset, offset + length)`` of one of this snapshot's delta files."""

    file: SafePath
    offset: Size
    length: Size


class ShardEntry(_Model):
    """One safetensors file of the rebuilt snapshot."""

    path: SafePath
    size: Size
    """Size of the whole rebuilt file."""
    header_length: Annotated[int, Field(ge=2, le=100 * 1024 * 1024)]
    """Bytes of its JSON header (after the 8-byte length prefix)."""
    header_hash: Xxh3Hex
    """xxh3-128 of those header bytes."""
    header: ByteRange | None = None
    """Incremental: where the zstd-compressed header is stored; absent when it is
    byte-identical to the previous snapshot's file of the same path. Full/LoRA: absent
    (the file itself is stored)."""


class TensorPart(_Model):
    """v4: elements ``[start, start + length)`` of a tensor's flattened (row-major) words,
    stored on their own. A part of a Full or of a tensor new in a delta is ``stored`` (its
    bytes as they are, at ``data``) or ``raw``; a part of a delta may use any codec (but
    ``parts``) against the same range of the previous tensor."""

    start: Annotated[int, Field(ge=0)]
    length: Annotated[int, Field(ge=1)]
    codec: CodecId
    data: ByteRange | None = None
    """Where its payload is stored (or, for ``stored``, its bytes); absent for ``unchanged``."""
    changed: Annotated[int, Field(ge=0)] | None = None
    """Elements of the part whose bits differ from the previous tensor (delta codecs)."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.codec is CodecId.PARTS:
            raise ValueError("a part cannot itself be made of parts")
        if (self.codec is not CodecId.UNCHANGED) != (self.data is not None):
            raise ValueError(f"part at {self.start}: codec {self.codec} and data disagree")
        if self.changed is not None and self.changed > self.length:
            raise ValueError(f"part at {self.start} declares more changes than elements")
        return self


class TensorEntry(_Model):
    """One tensor of the rebuilt snapshot."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_BYTES)]
    dtype: str
    shape: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_DIMS)]
    file: SafePath
    """The shard (a ``shards`` path) it lives in."""
    codec: CodecId
    hash: Xxh3Hex
    """xxh3-128 of the rebuilt tensor's bytes."""
    data: ByteRange | None = None
    """Where its encoded payload is stored (absent for ``stored`` and ``unchanged``)."""
    changed: Annotated[int, Field(ge=0)] | None = None
    """Elements whose bits differ from the previous tensor (delta codecs)."""
    parts: Annotated[list[TensorPart], Field(max_length=MAX_PARTS)] | None = None
    """v4, exactly for codec ``parts``: its parts in order, tiling ``[0, numel)``."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        numel = 1
        for dim in self.shape:
            numel *= dim
        if numel * DTYPES[self.dtype].width > MAX_TENSOR_BYTES:
            raise ValueError(f"tensor {self.name!r} is over the size limit")
        if self.changed is not None and self.changed > numel:
            raise ValueError(f"tensor {self.name!r} declares more changes than elements")
        wants_data = self.codec in PAYLOAD_CODECS
        if wants_data != (self.data is not None):
            raise ValueError(f"tensor {self.name!r}: codec {self.codec} and data disagree")
        if (self.codec is CodecId.PARTS) != (self.parts is not None):
            raise ValueError(f"tensor {self.name!r}: parts are listed exactly for codec parts")
        if self.parts is not None:
            if self.changed is not None:
                raise ValueError(f"tensor {self.name!r}: its parts count their own changes")
            self._check_parts(self.parts, numel)
        return self

    def _check_parts(self, parts: list[TensorPart], numel: int) -> None:
        """The parts tile the flattened tensor exactly: in order, none overlapping another,
        none missing, none past its end; a ``stored`` part's bytes are exactly its size."""
        width = DTYPES[self.dtype].width
        end = 0
        for part in parts:
            if part.start < end:
                raise ValueError(f"tensor {self.name!r}: part at {part.start} overlaps another")
            if part.start > end:
                raise ValueError(f"tensor {self.name!r}: elements {end}..{part.start} missing")
            end = part.start + part.length
            if end > numel:
                raise ValueError(f"tensor {self.name!r}: part at {part.start} ends past it")
            stored = part.codec is CodecId.STORED and part.data is not None
            if stored and part.data is not None and part.data.length != part.length * width:
                raise ValueError(f"tensor {self.name!r}: stored part at {part.start} size")
        if end != numel:
            raise ValueError(f"tensor {self.name!r}: elements {end}..{numel} missing")

    def payload_ranges(self) -> list[ByteRange]:
        """Every byte range the tensor's rebuild reads (its own, or its parts')."""
        if self.parts is not None:
            return [part.data for part in self.parts if part.data is not None]
        return [self.data] if self.data is not None else []

    @property
    def numel(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].width


class ManifestCheckpoint(_Model):
    """v5: a Full holding the same weights as a snapshot of this delta's chain, published
    beside the chain (docs/snapshot-format.md, "Checkpoints (v5)").

    A reader walking the chain back from this delta stops at ``of``: a replica holding
    ``of`` or a later snapshot of the chain applies the deltas; any other loads the Full
    ``identity`` and then the deltas after ``of``. The reader checks that the Full's
    tensor-set digest equals the ``previousDigest`` of the delta that applies to ``of``,
    so a checkpoint of other weights is a broken chain, never a silent swap."""

    identity: ValidIdentity
    """The checkpoint: a Full snapshot in the same bucket."""
    of: ValidIdentity
    """The snapshot of the chain whose weights it holds."""


class Manifest(_Model):
    """Everything a reader needs to fetch, verify and rebuild one snapshot."""

    format: str = FORMAT
    """``hotload-delta/v3`` (written), ``/v4`` (written when tensors have parts), ``/v5``
    (written when a delta names a checkpoint), ``/v2`` or ``/v1`` (read); others are
    refused."""
    identity: ValidIdentity
    step: Annotated[int, Field(ge=0)]
    kind: SnapshotKind
    previous: ValidIdentity | None = None
    """Incremental only: the identity this delta applies to."""
    previous_digest: Xxh3Hex | None = None
    """Incremental only: digest of the previous snapshot's tensors (names and hashes)."""
    file_hash: FileHash = FileHash.SHA256
    tensor_hash: str = TENSOR_HASH
    ignored_config_fields: Annotated[list[str], Field(max_length=256)] = Field(default_factory=list)
    """config.json keys that may differ from the previous snapshot's."""
    files: list[StoredFile] = Field(default_factory=list)
    """Files of the rebuilt snapshot stored here as they are (a Full: all of them)."""
    deltas: list[StoredFile] = Field(default_factory=list)
    """Incremental only: the encoded tensor data, read by the decoder."""
    referenced: list[ReferencedFile] = Field(default_factory=list)
    """Incremental only: files unchanged since the previous snapshot, not copied."""
    referenced_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    """v3, when ``referenced`` is not empty: sha256 committing to every referenced file
    (path, size, sha256; :func:`hotload.snapshot.digest.referenced_digest`)."""
    shards: list[ShardEntry] = Field(default_factory=list)
    removed: Annotated[list[str], Field(max_length=MAX_TENSORS)] = Field(default_factory=list)
    """Incremental only: tensors of the previous snapshot that this one no longer has."""
    tensors: Annotated[list[TensorEntry], Field(max_length=MAX_TENSORS)] = Field(
        default_factory=list
    )
    checkpoint: ManifestCheckpoint | None = None
    """v5, Incremental only: the newest checkpoint of this delta's chain."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {FORMATS}")
        self._check_checkpoint()
        if self.tensor_hash != TENSOR_HASH:
            raise ValueError(f"tensorHash {self.tensor_hash!r} is not {TENSOR_HASH!r}")
        incremental = self.kind is SnapshotKind.INCREMENTAL
        if incremental != (self.previous is not None):
            raise ValueError("previous is required for (and only for) Incremental snapshots")
        if incremental != (self.previous_digest is not None):
            raise ValueError("previousDigest is required for (and only for) Incremental")
        parted = self._check_parts_allowed(incremental)
        if not incremental and (self.referenced or self.removed or (self.deltas and not parted)):
            raise ValueError(f"a {self.kind.value} snapshot is complete: no deltas, no references")
        if len(self.files) + len(self.deltas) + len(self.referenced) > MAX_FILES:
            raise ValueError("too many files")
        self._check_file_hashes()
        outputs = [f.path for f in self.files]
        outputs += [f.path for f in self.referenced]
        shard_paths = [s.path for s in self.shards]
        if incremental or parted:
            outputs += shard_paths
        elif set(shard_paths) != {f.path for f in self.files if f.path.endswith(".safetensors")}:
            raise ValueError("a complete snapshot lists exactly its stored safetensors as shards")
        names = [*outputs, *(d.path for d in self.deltas), MANIFEST_NAME]
        if len(set(names)) != len(names):
            raise ValueError("a file name appears twice (or shadows the manifest)")
        lowered = {name.lower() for name in names}
        if len(lowered) != len(names):
            raise ValueError("two file names differ only by case")
        delta_sizes = {d.path: d.size for d in self.deltas}
        shards = set(shard_paths)
        seen: set[str] = set()
        for tensor in self.tensors:
            if tensor.name in seen:
                raise ValueError(f"tensor {tensor.name!r} listed twice")
            seen.add(tensor.name)
            if tensor.file not in shards:
                raise ValueError(f"tensor {tensor.name!r} names a shard not in shards")
            if (tensor.codec is CodecId.STORED) == (incremental or parted):
                raise ValueError(f"tensor {tensor.name!r}: codec {tensor.codec} in a {self.kind}")
            if tensor.codec is CodecId.CONTEXT and self.format == FORMAT_V1:
                raise ValueError(f"tensor {tensor.name!r}: codec context needs {FORMAT_V2}")
            if parted and tensor.codec is not CodecId.PARTS:
                raise ValueError(f"tensor {tensor.name!r}: every tensor of a parted Full has parts")
            if not incremental and any(
                part.codec not in COMPLETE_PART_CODECS for part in tensor.parts or ()
            ):
                raise ValueError(f"tensor {tensor.name!r}: a Full's parts are stored or raw")
            for byte_range in tensor.payload_ranges():
                _check_range(byte_range, delta_sizes, tensor.name)
        if seen & set(self.removed) or len(set(self.removed)) != len(self.removed):
            raise ValueError("a removed tensor is listed twice or is also a tensor")
        for shard in self.shards:
            if parted and shard.header is None:
                raise ValueError(f"a parted Full stores the header of {shard.path!r}")
            if shard.header is not None:
                if not (incremental or parted):
                    raise ValueError("a Full snapshot's shard headers are in the shards")
                _check_range(shard.header, delta_sizes, shard.path)
        return self

    def builds_on(self, identity: str | None) -> bool:
        """Whether this delta may be decoded onto a rebuild of ``identity``: its previous
        snapshot, or, for the delta right after its checkpoint's snapshot, the checkpoint
        (the same weights; the decoder checks the digest either way)."""
        if identity == self.previous:
            return True
        checkpoint = self.checkpoint
        return checkpoint is not None and (checkpoint.of, checkpoint.identity) == (
            self.previous,
            identity,
        )

    def _check_checkpoint(self) -> None:
        checkpoint = self.checkpoint
        if (checkpoint is not None) != (self.format == FORMAT_CHECKPOINT):
            raise ValueError(f"a checkpoint is named in (and only in) {FORMAT_CHECKPOINT}")
        if checkpoint is None:
            return
        if self.kind is not SnapshotKind.INCREMENTAL:
            raise ValueError("only an Incremental snapshot names a checkpoint")
        if self.identity in (checkpoint.identity, checkpoint.of):
            raise ValueError("a delta's checkpoint is of an older snapshot, not of itself")
        if checkpoint.identity == checkpoint.of:
            raise ValueError("a checkpoint is a Full beside the chain, not a snapshot of it")

    def _check_parts_allowed(self, incremental: bool) -> bool:
        """Whether this is a *parted Full* (its tensors stored as parts, its shards rebuilt
        from stored headers, as a delta's are); parts need v4, never in a LoRA, and at
        most ``MAX_PARTS`` in all."""
        counts = [len(t.parts) for t in self.tensors if t.parts is not None]
        if not counts:
            return False
        if self.format not in PARTED_FORMATS:
            raise ValueError(f"tensors stored as parts need {FORMAT_V4} or later")
        if self.kind is SnapshotKind.LORA:
            raise ValueError("a LoRA adapter is never stored as parts")
        if sum(counts) > MAX_PARTS:
            raise ValueError("too many parts")
        return not incremental

    @property
    def has_parts(self) -> bool:
        """Some tensor is stored as parts (v4)."""
        return any(tensor.parts is not None for tensor in self.tensors)

    def _check_file_hashes(self) -> None:
        v3 = self.format in (FORMAT_V3, *PARTED_FORMATS)  # v4 and v5 keep every rule of v3
        if v3 and self.file_hash is not FileHash.SHA256:
            raise ValueError(f"{FORMAT_V3} stores sha256 file hashes only")
        if any((entry.hash is None) != v3 for entry in self.referenced):
            raise ValueError(f"referenced files carry a hash before {FORMAT_V3}, none in it")
        if (self.referenced_digest is not None) != (v3 and bool(self.referenced)):
            raise ValueError(f"referencedDigest is required for (and only for) {FORMAT_V3}")
        pattern = _HEX[self.file_hash]
        hashes = [(entry.path, entry.hash) for entry in (*self.files, *self.deltas)]
        hashes += [(entry.path, entry.hash) for entry in self.referenced if entry.hash]
        for path, digest in hashes:
            if not re.match(pattern, digest):
                raise ValueError(f"{path}: hash is not a {self.file_hash.value} digest")

    def files_to_fetch(self) -> list[str]:
        """Relative paths to download from ``<prefix>/<identity>/`` (validated; no manifest)."""
        return [entry.path for entry in (*self.files, *self.deltas)]

    def stored_bytes(self) -> int:
        """Bytes of every file this snapshot stores (the manifest excluded)."""
        return sum(entry.size for entry in (*self.files, *self.deltas))

    def tensor_bytes(self) -> int:
        """Bytes of tensor data in the rebuilt snapshot."""
        return sum(tensor.nbytes for tensor in self.tensors)

    def dumps(self) -> bytes:
        """The manifest as stored: v1 compact camelCase JSON; v2 the same document with a
        columnar tensor table, zstd-compressed; v3 a binary table, zstd-compressed
        (:mod:`manifest_codec`)."""
        document = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dump_document(document)


def _check_range(byte_range: ByteRange, sizes: dict[str, int], owner: str) -> None:
    size = sizes.get(byte_range.file)
    if size is None:
        raise ValueError(f"{owner!r} points into {byte_range.file!r}, not a delta file")
    if byte_range.offset + byte_range.length > size:
        raise ValueError(f"{owner!r} points past the end of {byte_range.file!r}")


def parse_manifest(data: bytes, *, expected_identity: Identity | None = None) -> Manifest:
    """Parse and validate a manifest; every problem is :class:`ManifestInvalid`.

    ``expected_identity`` (the prefix it was read from) must match the manifest's own
    identity: a manifest copied under another name is refused.
    """
    document = load_document(data)
    try:
        manifest = Manifest.model_validate(document)
    except ValidationError as err:
        first = err.errors()[0]
        error_class = UnsafePath if first.get("type") == _UNSAFE_PATH else ManifestInvalid
        raise error_class(
            "manifest does not satisfy the format",
            field=".".join(str(p) for p in first.get("loc", ())),
            problem=first.get("msg", ""),
            identity=document.get("identity"),
        ) from None
    if expected_identity is not None and manifest.identity != expected_identity:
        raise ManifestInvalid(
            "manifest is for another snapshot",
            expected=expected_identity,
            found=manifest.identity,
        )
    return manifest


def read_manifest(snapshot: Path) -> Manifest:
    """The manifest of the snapshot directory ``snapshot`` (size-capped, validated)."""
    path = snapshot / MANIFEST_NAME
    if not path.is_file():
        raise ManifestInvalid("snapshot directory has no manifest", path=str(snapshot))
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise SizeLimitExceeded("manifest over its size limit", path=str(path))
    return parse_manifest(path.read_bytes())
