"""v3's binary manifest table: the manifest document as varints, raw hashes and columns.

v2's columnar JSON left the manifest at 3-4% of an RL delta of a 22M-parameter model
(bench/codec): hex hashes, JSON punctuation, repeated names, and one sha256 per file
that the delta only references. Here every integer is a LEB128 varint, every hash its
raw bytes, tensor names share their prefix with the previous name, the tensors are
stored column by column (like values next to each other, so zstd finds them), and the
referenced files are committed to by one sha256 (``referencedDigest``) instead of one
each (docs/snapshot-format.md, "Binary table (v3)").

v4 is the same table with magic ``HLD\x04``, one more codec (``parts``) and, after the
hashes, the parts of the tensors stored as parts (docs/snapshot-format.md, "Parts (v4)").
v5 is v4 with magic ``HLD\x05`` and, after an Incremental's ``previousDigest``, its
checkpoint: the Full's identity and the identity it is of (docs/snapshot-format.md,
"Checkpoints (v5)").

This module converts a manifest *document* (the camelCase dict the pydantic model
dumps) to the table's bytes and back; it checks only what it must to read the bytes
safely (every read bounded, every index in range, nothing left over), and leaves every
rule of the format to :mod:`manifest`, which validates the document it returns. Every
problem is :class:`ManifestInvalid` saying what and where.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from hotload.api.formats import FORMAT_V3, FORMAT_V4, FORMAT_V5
from hotload.errors import ManifestInvalid
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.limits import MAX_DIMS, MAX_FILES, MAX_PARTS, MAX_TENSORS

MAGIC: Final = b"HLD\x03"
"""First bytes of a v3 table (inside its zstd frame)."""
MAGIC_V4: Final = b"HLD\x04"
"""First bytes of a v4 table: a v3 reader takes it for JSON text and refuses it."""
MAGIC_V5: Final = b"HLD\x05"
"""First bytes of a v5 table (a v4 one naming a checkpoint)."""
MAGICS: Final = {MAGIC: FORMAT_V3, MAGIC_V4: FORMAT_V4, MAGIC_V5: FORMAT_V5}
_PARTED: Final = (FORMAT_V4, FORMAT_V5)

KINDS: Final = ("Full", "Incremental", "LoRA")
CODECS: Final = (
    "stored",
    "unchanged",
    "raw",
    "dense-xor",
    "dense-sub",
    "sparse",
    "context",
    "parts",
)
"""Codec ids by their number in the table (``parts``, 7, only in v4)."""
_NO_DATA: Final = frozenset(("stored", "unchanged", "parts"))
_PARTS: Final = "parts"
DTYPE_NAMES: Final = tuple(DTYPES)
"""Dtypes by their number in the table (docs/snapshot-format.md, "Dtypes", in order)."""
_SHA256: Final = 32
_XXH3: Final = 16
_MAX_VARINT_BYTES: Final = 9
_MAX_STRING: Final = 1 << 20
"""No string of a manifest is longer (paths and names stop at 1 KiB; the model checks)."""


def dump_table(document: dict[str, Any]) -> bytes:
    """The v3 (or, for format v4 or v5, v4 or v5) table of a validated manifest document
    (sha256 files, xxh3-128 tensors)."""
    version = str(document.get("format"))
    v4 = version in _PARTED
    out = bytearray({FORMAT_V4: MAGIC_V4, FORMAT_V5: MAGIC_V5}.get(version, MAGIC))
    writer = _Writer(out)
    writer.string(document["identity"])
    writer.varint(document["step"])
    writer.byte(KINDS.index(document["kind"]))
    if document["kind"] == "Incremental":
        writer.string(document["previous"])
        writer.hex(document["previousDigest"], _XXH3)
        if version == FORMAT_V5:
            writer.string(document["checkpoint"]["identity"])
            writer.string(document["checkpoint"]["of"])
    writer.strings(document.get("ignoredConfigFields", []))
    for key in ("files", "deltas"):
        entries = document.get(key, [])
        writer.varint(len(entries))
        for entry in entries:
            writer.string(entry["path"])
            writer.varint(entry["size"])
            writer.hex(entry["hash"], _SHA256)
    referenced = document.get("referenced", [])
    writer.varint(len(referenced))
    for entry in referenced:
        writer.string(entry["path"])
        writer.varint(entry["size"])
    if referenced:
        writer.hex(document["referencedDigest"], _SHA256)
    deltas = {entry["path"]: index for index, entry in enumerate(document.get("deltas", []))}
    shards = document.get("shards", [])
    writer.varint(len(shards))
    for shard in shards:
        writer.string(shard["path"])
        writer.varint(shard["size"])
        writer.varint(shard["headerLength"])
        writer.hex(shard["headerHash"], _XXH3)
        header = shard.get("header")
        writer.varint(0 if header is None else deltas[header["file"]] + 1)
        if header is not None:
            writer.varint(header["offset"])
            writer.varint(header["length"])
    writer.strings(document.get("removed", []))
    ends = _dump_tensors(writer, document.get("tensors", []), shards, deltas)
    if v4:
        _dump_parts(writer, document.get("tensors", []), deltas, ends)
    return bytes(out)


def _dump_tensors(
    writer: _Writer, tensors: list[dict[str, Any]], shards: list[Any], deltas: dict[str, int]
) -> dict[str, int]:
    """The tensor columns; returns where the last range in each delta file ended."""
    shard_index = {shard["path"]: index for index, shard in enumerate(shards)}
    writer.varint(len(tensors))
    previous = b""
    for tensor in tensors:
        name = tensor["name"].encode("utf-8")
        shared = _shared_prefix(previous, name)
        writer.varint(shared)
        writer.raw_string(name[shared:])
        previous = name
    for tensor in tensors:
        writer.byte(DTYPE_NAMES.index(tensor["dtype"]))
    for tensor in tensors:
        writer.varint(len(tensor["shape"]))
        for dim in tensor["shape"]:
            writer.varint(dim)
    for tensor in tensors:
        writer.varint(shard_index[tensor["file"]])
    for tensor in tensors:
        writer.byte(CODECS.index(tensor["codec"]))
    ranges = [tensor["data"] for tensor in tensors if tensor.get("data") is not None]
    for data in ranges:
        writer.varint(deltas[data["file"]])
    ends: dict[str, int] = {}
    for data in ranges:
        writer.varint(data["offset"] - ends.get(data["file"], 0))
        ends[data["file"]] = data["offset"] + data["length"]
    _dump_lengths(writer, ranges)
    _dump_changed(writer, tensors)
    for tensor in tensors:
        writer.hex(tensor["hash"], _XXH3)
    return ends


def _dump_lengths(writer: _Writer, ranges: list[dict[str, Any]]) -> None:
    for data in ranges:
        writer.varint(data["length"])


def _dump_changed(writer: _Writer, items: list[dict[str, Any]]) -> None:
    for item in items:
        changed = item.get("changed")
        writer.varint(0 if changed is None else changed + 1)


def _dump_parts(
    writer: _Writer, tensors: list[dict[str, Any]], deltas: dict[str, int], ends: dict[str, int]
) -> None:
    """v4: per tensor stored as parts, its part count; then over all those parts, column
    by column: length, codec, changed, and the data columns (delta file, skip since the
    end of the previous range in that file, tensors' ranges included, length). A part's
    start is the sum of the lengths before it: a table cannot express a gap or overlap."""
    parts = [part for tensor in tensors if tensor["codec"] == _PARTS for part in tensor["parts"]]
    for tensor in tensors:
        if tensor["codec"] == _PARTS:
            writer.varint(len(tensor["parts"]))
    for part in parts:
        writer.varint(part["length"])
    for part in parts:
        writer.byte(CODECS.index(part["codec"]))
    _dump_changed(writer, parts)
    ranges = [part["data"] for part in parts if part.get("data") is not None]
    for data in ranges:
        writer.varint(deltas[data["file"]])
    for data in ranges:
        writer.varint(data["offset"] - ends.get(data["file"], 0))
        ends[data["file"]] = data["offset"] + data["length"]
    _dump_lengths(writer, ranges)


def _shared_prefix(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    shared = 0
    while shared < limit and a[shared] == b[shared]:
        shared += 1
    return shared


def load_table(data: bytes) -> dict[str, Any]:
    """The manifest document in the v3, v4 or v5 table ``data`` (magic included), not yet
    validated."""
    reader = _Reader(data)
    version = MAGICS.get(reader.take(len(MAGIC), "magic"))
    if version is None:
        raise ManifestInvalid("not a v3, v4 or v5 manifest table", found=data[:4].hex())
    document: dict[str, Any] = {
        "format": version,
        "identity": reader.string("identity"),
        "step": reader.varint("step"),
        "kind": reader.choice(KINDS, "kind"),
        "fileHash": "sha256",
        "tensorHash": "xxh3-128",
    }
    if document["kind"] == "Incremental":
        document["previous"] = reader.string("previous")
        document["previousDigest"] = reader.hex(_XXH3, "previousDigest")
        if version == FORMAT_V5:
            document["checkpoint"] = {
                "identity": reader.string("checkpoint.identity"),
                "of": reader.string("checkpoint.of"),
            }
    document["ignoredConfigFields"] = reader.strings("ignoredConfigFields", MAX_FILES)
    for key in ("files", "deltas"):
        document[key] = [
            {
                "path": reader.string(f"{key}[{index}].path"),
                "size": reader.varint(f"{key}[{index}].size"),
                "hash": reader.hex(_SHA256, f"{key}[{index}].hash"),
            }
            for index in range(reader.count(key, MAX_FILES))
        ]
    document["referenced"] = [
        {
            "path": reader.string(f"referenced[{index}].path"),
            "size": reader.varint(f"referenced[{index}].size"),
        }
        for index in range(reader.count("referenced", MAX_FILES))
    ]
    if document["referenced"]:
        document["referencedDigest"] = reader.hex(_SHA256, "referencedDigest")
    delta_paths = [entry["path"] for entry in document["deltas"]]
    document["shards"] = [
        _load_shard(reader, index, delta_paths)
        for index in range(reader.count("shards", MAX_FILES))
    ]
    document["removed"] = reader.strings("removed", MAX_TENSORS)
    document["tensors"], ends = _load_tensors(reader, document, version in _PARTED)
    if version in _PARTED:
        _load_parts(reader, document, ends)
    if reader.remaining():
        raise ManifestInvalid("bytes follow the manifest table", extra=reader.remaining())
    return document


def _load_shard(reader: _Reader, index: int, delta_paths: list[str]) -> dict[str, Any]:
    where = f"shards[{index}]"
    shard: dict[str, Any] = {
        "path": reader.string(f"{where}.path"),
        "size": reader.varint(f"{where}.size"),
        "headerLength": reader.varint(f"{where}.headerLength"),
        "headerHash": reader.hex(_XXH3, f"{where}.headerHash"),
    }
    delta = reader.varint(f"{where}.header")
    if delta:
        shard["header"] = {
            "file": reader.index(delta_paths, delta - 1, f"{where}.header"),
            "offset": reader.varint(f"{where}.header.offset"),
            "length": reader.varint(f"{where}.header.length"),
        }
    return shard


def _load_tensors(
    reader: _Reader, document: dict[str, Any], v4: bool
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    count = reader.count("tensors", MAX_TENSORS)
    names: list[str] = []
    previous = b""
    for row in range(count):
        shared = reader.varint("tensors.name", row)
        if shared > len(previous):
            raise ManifestInvalid(
                "v3 tensor name shares more than the previous name", row=row, shared=shared
            )
        name = previous[:shared] + reader.raw_string("tensors.name", row)
        names.append(_utf8(name, "tensors.name", row))
        previous = name
    dtypes = [reader.choice(DTYPE_NAMES, "tensors.dtype", row) for row in range(count)]
    shapes = [_load_shape(reader, row) for row in range(count)]
    shard_paths = [shard["path"] for shard in document["shards"]]
    files = [
        reader.index(shard_paths, reader.varint("tensors.file", row), "tensors.file", row)
        for row in range(count)
    ]
    allowed = CODECS if v4 else CODECS[:-1]
    codecs = [reader.choice(allowed, "tensors.codec", row) for row in range(count)]
    ends: dict[str, int] = {}
    ranges = _load_ranges(
        reader,
        [codec not in _NO_DATA for codec in codecs],
        [entry["path"] for entry in document["deltas"]],
        ends,
        "tensors",
    )
    changed = [reader.varint("tensors.changed", row) for row in range(count)]
    hashes = reader.take(_XXH3 * count, "tensors.hash").hex()
    tensors: list[dict[str, Any]] = []
    for row in range(count):
        tensor: dict[str, Any] = {
            "name": names[row],
            "dtype": dtypes[row],
            "shape": shapes[row],
            "file": files[row],
            "codec": codecs[row],
            "hash": hashes[2 * _XXH3 * row : 2 * _XXH3 * (row + 1)],
        }
        if ranges[row] is not None:
            tensor["data"] = ranges[row]
        if changed[row]:
            tensor["changed"] = changed[row] - 1
        tensors.append(tensor)
    return tensors, ends


def _load_parts(reader: _Reader, document: dict[str, Any], ends: dict[str, int]) -> None:
    """v4: the parts of every tensor with codec ``parts`` (see :func:`_dump_parts`)."""
    parted = [tensor for tensor in document["tensors"] if tensor["codec"] == _PARTS]
    counts = [reader.count("tensors.parts", MAX_PARTS) for _ in parted]
    total = sum(counts)
    if total > MAX_PARTS or total > reader.remaining():
        raise ManifestInvalid("v4 manifest lists more parts than allowed", parts=total)
    lengths = [reader.varint("parts.length", row) for row in range(total)]
    codecs = [reader.choice(CODECS[:-1], "parts.codec", row) for row in range(total)]
    changed = [reader.varint("parts.changed", row) for row in range(total)]
    delta_paths = [entry["path"] for entry in document["deltas"]]
    ranges = _load_ranges(
        reader, [codec != "unchanged" for codec in codecs], delta_paths, ends, "parts"
    )
    row = 0
    for tensor, count in zip(parted, counts, strict=True):
        start = 0
        tensor["parts"] = []
        for _ in range(count):
            part: dict[str, Any] = {"start": start, "length": lengths[row], "codec": codecs[row]}
            if ranges[row] is not None:
                part["data"] = ranges[row]
            if changed[row]:
                part["changed"] = changed[row] - 1
            tensor["parts"].append(part)
            start += lengths[row]
            row += 1


def _load_ranges(
    reader: _Reader,
    has_data: list[bool],
    delta_paths: list[str],
    ends: dict[str, int],
    column: str,
) -> list[dict[str, Any] | None]:
    """The data columns (delta file, skip, length of every row that has a payload) as
    each row's byte range, None for the others; ``ends`` (where the last range in each
    delta file ended) is carried from the tensors' columns to the parts'."""
    rows = [row for row, data in enumerate(has_data) if data]
    files = [
        reader.index(delta_paths, reader.varint(f"{column}.data", row), f"{column}.data", row)
        for row in rows
    ]
    skips = [reader.varint(f"{column}.data.skip", row) for row in rows]
    ranges: list[dict[str, Any] | None] = [None] * len(has_data)
    for row, file, skip in zip(rows, files, skips, strict=True):
        offset = ends.get(file, 0) + skip
        length = reader.varint(f"{column}.data.length", row)
        ends[file] = offset + length
        ranges[row] = {"file": file, "offset": offset, "length": length}
    return ranges


def _load_shape(reader: _Reader, row: int) -> list[int]:
    dims = reader.varint("tensors.shape", row)
    if dims > MAX_DIMS:
        raise ManifestInvalid("v3 tensor has too many dimensions", row=row, dims=dims)
    return [reader.varint("tensors.shape", row) for _ in range(dims)]


def _utf8(data: bytes, field: str, row: int | None = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestInvalid("v3 manifest string is not UTF-8", field=field, row=row) from None


class _Writer:
    def __init__(self, out: bytearray) -> None:
        self.out = out

    def varint(self, value: int) -> None:
        if type(value) is not int or not 0 <= value < 1 << 63:
            raise ValueError(f"not a varint: {value!r}")
        while True:
            byte = value & 0x7F
            value >>= 7
            if not value:
                self.out.append(byte)
                return
            self.out.append(byte | 0x80)

    def byte(self, value: int) -> None:
        self.out.append(value)

    def raw_string(self, data: bytes) -> None:
        self.varint(len(data))
        self.out += data

    def string(self, value: str) -> None:
        self.raw_string(value.encode("utf-8"))

    def strings(self, values: list[str]) -> None:
        self.varint(len(values))
        for value in values:
            self.string(value)

    def hex(self, value: str, width: int) -> None:
        data = bytes.fromhex(value)
        if len(data) != width:
            raise ValueError(f"not a {width}-byte hex digest: {value!r}")
        self.out += data


class _Reader:
    """A cursor over the table that never reads past its end and names the field it read
    (``field``, and ``row`` for a tensor column: formatted only when something is wrong,
    so reading stays cheap)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _fail(self, message: str, field: str, row: int | None, **context: object) -> NoReturn:
        where = field if row is None else f"{field} of tensor {row}"
        raise ManifestInvalid(message, field=where, at=self.pos, **context)

    def take(self, length: int, field: str, row: int | None = None) -> bytes:
        if length > len(self.data) - self.pos:
            self._fail("v3 manifest table is truncated", field, row)
        chunk = self.data[self.pos : self.pos + length]
        self.pos += length
        return chunk

    def varint(self, field: str, row: int | None = None) -> int:
        data, pos = self.data, self.pos
        value = 0
        for index in range(_MAX_VARINT_BYTES):
            if pos >= len(data):
                self._fail("v3 manifest table is truncated", field, row)
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                self.pos = pos
                if byte == 0 and index > 0:
                    self._fail("v3 manifest has a non-canonical varint", field, row)
                return value
        self.pos = pos
        self._fail("v3 manifest varint is too long", field, row)

    def count(self, field: str, limit: int) -> int:
        """A list's length: within ``limit`` and no more items than bytes left (each item
        takes at least one), so a hostile count cannot make the reader loop or allocate."""
        value = self.varint(field)
        if value > limit or value > self.remaining():
            self._fail("v3 manifest list is longer than allowed", field, None, count=value)
        return value

    def raw_string(self, field: str, row: int | None = None) -> bytes:
        length = self.varint(field, row)
        if length > _MAX_STRING:
            self._fail("v3 manifest string is too long", field, row, length=length)
        return self.take(length, field, row)

    def string(self, field: str) -> str:
        return _utf8(self.raw_string(field), field)

    def strings(self, field: str, limit: int) -> list[str]:
        return [self.string(field) for _ in range(self.count(field, limit))]

    def hex(self, width: int, field: str, row: int | None = None) -> str:
        return self.take(width, field, row).hex()

    def choice(self, values: tuple[str, ...], field: str, row: int | None = None) -> str:
        number = self.take(1, field, row)[0]
        if number >= len(values):
            self._fail("v3 manifest names an unknown value", field, row, number=number)
        return values[number]

    def index(self, paths: list[str], number: int, field: str, row: int | None = None) -> str:
        if not 0 <= number < len(paths):
            self._fail("v3 manifest names no listed file", field, row, index=number)
        return paths[number]
