"""v3's binary manifest table: the manifest document as varints, raw hashes and columns.

v2's columnar JSON left the manifest at 3-4% of an RL delta of a 22M-parameter model
(bench/codec): hex hashes, JSON punctuation, repeated names, and one sha256 per file
that the delta only references. Here every integer is a LEB128 varint, every hash its
raw bytes, tensor names share their prefix with the previous name, the tensors are
stored column by column (like values next to each other, so zstd finds them), and the
referenced files are committed to by one sha256 (``referencedDigest``) instead of one
each (docs/snapshot-format.md, "Binary table (v3)").

This module converts a manifest *document* (the camelCase dict the pydantic model
dumps) to the table's bytes and back; it checks only what it must to read the bytes
safely (every read bounded, every index in range, nothing left over), and leaves every
rule of the format to :mod:`manifest`, which validates the document it returns. Every
problem is :class:`ManifestInvalid` saying what and where.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from hotload.api.formats import FORMAT_V3
from hotload.errors import ManifestInvalid
from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.limits import MAX_DIMS, MAX_FILES, MAX_TENSORS

MAGIC: Final = b"HLD\x03"
"""First bytes of a v3 table (inside its zstd frame)."""

KINDS: Final = ("Full", "Incremental", "LoRA")
CODECS: Final = ("stored", "unchanged", "raw", "dense-xor", "dense-sub", "sparse", "context")
"""Codec ids by their number in the table."""
_NO_DATA: Final = frozenset(("stored", "unchanged"))
DTYPE_NAMES: Final = tuple(DTYPES)
"""Dtypes by their number in the table (docs/snapshot-format.md, "Dtypes", in order)."""
_SHA256: Final = 32
_XXH3: Final = 16
_MAX_VARINT_BYTES: Final = 9
_MAX_STRING: Final = 1 << 20
"""No string of a manifest is longer (paths and names stop at 1 KiB; the model checks)."""


def dump_table(document: dict[str, Any]) -> bytes:
    """The v3 table of a validated manifest document (sha256 files, xxh3-128 tensors)."""
    out = bytearray(MAGIC)
    writer = _Writer(out)
    writer.string(document["identity"])
    writer.varint(document["step"])
    writer.byte(KINDS.index(document["kind"]))
    if document["kind"] == "Incremental":
        writer.string(document["previous"])
        writer.hex(document["previousDigest"], _XXH3)
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
    _dump_tensors(writer, document.get("tensors", []), shards, deltas)
    return bytes(out)


def _dump_tensors(
    writer: _Writer, tensors: list[dict[str, Any]], shards: list[Any], deltas: dict[str, int]
) -> None:
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
    for data in ranges:
        writer.varint(data["length"])
    for tensor in tensors:
        changed = tensor.get("changed")
        writer.varint(0 if changed is None else changed + 1)
    for tensor in tensors:
        writer.hex(tensor["hash"], _XXH3)


def _shared_prefix(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    shared = 0
    while shared < limit and a[shared] == b[shared]:
        shared += 1
    return shared


def load_table(data: bytes) -> dict[str, Any]:
    """The manifest document in the v3 table ``data`` (magic included), not yet validated."""
    reader = _Reader(data)
    if reader.take(len(MAGIC), "magic") != MAGIC:
        raise ManifestInvalid("not a v3 manifest table", found=data[:4].hex())
    document: dict[str, Any] = {
        "format": FORMAT_V3,
        "identity": reader.string("identity"),
        "step": reader.varint("step"),
        "kind": reader.choice(KINDS, "kind"),
        "fileHash": "sha256",
        "tensorHash": "xxh3-128",
    }
    if document["kind"] == "Incremental":
        document["previous"] = reader.string("previous")
        document["previousDigest"] = reader.hex(_XXH3, "previousDigest")
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
    document["tensors"] = _load_tensors(reader, document)
    if reader.remaining():
        raise ManifestInvalid("bytes follow the v3 manifest table", extra=reader.remaining())
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


def _load_tensors(reader: _Reader, document: dict[str, Any]) -> list[dict[str, Any]]:
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
    codecs = [reader.choice(CODECS, "tensors.codec", row) for row in range(count)]
    ranges = _load_ranges(reader, codecs, [entry["path"] for entry in document["deltas"]])
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
    return tensors


def _load_ranges(
    reader: _Reader, codecs: list[str], delta_paths: list[str]
) -> list[dict[str, Any] | None]:
    """The data columns (delta file, skip, length of every tensor that has a payload) as
    each tensor's byte range, None for the others."""
    rows = [row for row, codec in enumerate(codecs) if codec not in _NO_DATA]
    files = [
        reader.index(delta_paths, reader.varint("tensors.data", row), "tensors.data", row)
        for row in rows
    ]
    skips = [reader.varint("tensors.data.skip", row) for row in rows]
    ranges: list[dict[str, Any] | None] = [None] * len(codecs)
    ends: dict[str, int] = {}
    for row, file, skip in zip(rows, files, skips, strict=True):
        offset = ends.get(file, 0) + skip
        length = reader.varint("tensors.data.length", row)
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
