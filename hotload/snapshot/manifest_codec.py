"""The manifest's bytes: v1 JSON, v2's compact form (columnar tensors, zstd), v3's table.

In v1 every tensor is a JSON object (~250 bytes), which made the manifest about 12% of
an RL delta of a small model. v2 keeps the same document but stores the tensors as
columns (names together, hashes as one hex string, shard and delta files as indexes,
each payload's offset as the bytes skipped since the previous payload in the same
file: 0 when they follow each other, as the reference writer lays them out) and
compresses the whole with zstd, so what remains is mostly the tensors' hashes
(docs/snapshot-format.md, "The manifest"). That still left it at 3-4% of such a delta;
v3 stores the same document as a binary table (:mod:`manifest_table`) in the zstd frame.
The file keeps its name (``hotload-manifest.json``); a reader tells the forms apart by
the zstd magic number and, inside the frame, by the table's magic or a ``{``.

A reader also accepts any version as a JSON document with the tensors as a list of
objects, as in v1 (uncompressed or not): hand-written and tool-edited manifests stay
plain JSON. This module only converts bytes to documents and back; :mod:`manifest`
validates them.
"""

from __future__ import annotations

import json
from typing import Any, Final

import zstandard

from hotload.api.formats import FORMAT_V1, FORMAT_V2, READABLE_FORMATS
from hotload.errors import ManifestInvalid, SizeLimitExceeded
from hotload.snapshot.limits import MAX_MANIFEST_BYTES
from hotload.snapshot.manifest_table import MAGICS, dump_table, load_table

ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_COLUMNS: Final = ("name", "dtype", "shape", "file", "codec", "hash", "data", "changed")
_HASH_HEX: Final = 32


def dump_document(document: dict[str, Any]) -> bytes:
    """The stored bytes of a manifest document (camelCase, unset optionals left out)."""
    if document.get("format") == FORMAT_V1:
        return _json(document)
    if document.get("format") == FORMAT_V2:
        compact = dict(document)
        compact["tensors"] = _columns(document)
        text = _json(compact)
    else:
        text = dump_table(document)
    level = 19 if len(text) < 1 << 20 else 9
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return bytes(compressor.compress(text))


def load_document(data: bytes) -> dict[str, Any]:
    """The manifest document in ``data`` (any form), v2 tensors expanded to objects."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise SizeLimitExceeded("manifest over its size limit", size=len(data))
    text = _decompress(data) if data[:4] == ZSTD_MAGIC else data
    if data[:4] == ZSTD_MAGIC and text[:4] in MAGICS:
        return load_table(text)
    try:
        document = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ManifestInvalid("manifest is not UTF-8 JSON") from err
    if not isinstance(document, dict):
        raise ManifestInvalid("manifest is not a JSON object")
    declared = document.get("format")
    if declared not in READABLE_FORMATS:
        raise ManifestInvalid(
            "unsupported snapshot format", expected=READABLE_FORMATS, found=declared
        )
    if declared == FORMAT_V2 and isinstance(document.get("tensors"), dict):
        document["tensors"] = _rows(document)
    return document


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _decompress(data: bytes) -> bytes:
    try:
        declared = zstandard.get_frame_parameters(data).content_size
    except zstandard.ZstdError as err:
        raise ManifestInvalid("manifest is not a zstd frame") from err
    if declared > MAX_MANIFEST_BYTES:  # also "unknown", which python-zstandard reports huge
        raise SizeLimitExceeded("manifest declares more than its size limit", declared=declared)
    decoder = zstandard.ZstdDecompressor().decompressobj()
    try:
        text = decoder.decompress(data)
    except zstandard.ZstdError as err:
        raise ManifestInvalid("manifest is a corrupt zstd frame") from err
    if not decoder.eof or decoder.unused_data or len(text) != declared:
        raise ManifestInvalid("manifest frame does not match its declared size")
    return bytes(text)


def _columns(document: dict[str, Any]) -> dict[str, Any]:
    shards = {shard["path"]: index for index, shard in enumerate(document.get("shards", []))}
    deltas = {delta["path"]: index for index, delta in enumerate(document.get("deltas", []))}
    tensors = document.get("tensors", [])
    ends: dict[str, int] = {}
    data: list[list[int] | None] = []
    for t in tensors:
        if "data" not in t:
            data.append(None)
            continue
        byte_range = t["data"]
        skip = byte_range["offset"] - ends.get(byte_range["file"], 0)
        ends[byte_range["file"]] = byte_range["offset"] + byte_range["length"]
        data.append([deltas[byte_range["file"]], skip, byte_range["length"]])
    return {
        "name": [t["name"] for t in tensors],
        "dtype": [t["dtype"] for t in tensors],
        "shape": [t["shape"] for t in tensors],
        "file": [shards[t["file"]] for t in tensors],
        "codec": [t["codec"] for t in tensors],
        "hash": "".join(t["hash"] for t in tensors),
        "data": data,
        "changed": [t.get("changed") for t in tensors],
    }


def _rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """v2's columns as v1's tensor objects; ManifestInvalid when they do not line up."""
    columns = document["tensors"]
    if not isinstance(columns, dict) or set(columns) != set(_COLUMNS):
        raise ManifestInvalid("v2 tensors must be an object of columns", expected=_COLUMNS)
    names = columns["name"]
    hashes = columns["hash"]
    if not isinstance(names, list) or not isinstance(hashes, str):
        raise ManifestInvalid("v2 tensor columns have the wrong types")
    count = len(names)
    if any(not isinstance(columns[c], list) or len(columns[c]) != count for c in _COLUMNS[:5]):
        raise ManifestInvalid("v2 tensor columns differ in length")
    if any(not isinstance(columns[c], list) or len(columns[c]) != count for c in _COLUMNS[6:]):
        raise ManifestInvalid("v2 tensor columns differ in length")
    if len(hashes) != _HASH_HEX * count:
        raise ManifestInvalid("v2 tensor hashes do not match the tensor count")
    shards = _paths(document, "shards")
    deltas = _paths(document, "deltas")
    rows: list[dict[str, Any]] = []
    ends: dict[int, int] = {}
    for i in range(count):
        row: dict[str, Any] = {
            "name": names[i],
            "dtype": columns["dtype"][i],
            "shape": columns["shape"][i],
            "file": _indexed(shards, columns["file"][i], "file", i),
            "codec": columns["codec"][i],
            "hash": hashes[_HASH_HEX * i : _HASH_HEX * (i + 1)],
        }
        data = columns["data"][i]
        if data is not None:
            if (
                not isinstance(data, list)
                or len(data) != 3
                or not all(type(v) is int and v >= 0 for v in data)
            ):
                raise ManifestInvalid("v2 tensor data must be [delta, skip, length]", row=i)
            delta, skip, length = data
            offset = ends.get(delta, 0) + skip
            ends[delta] = offset + length
            row["data"] = {
                "file": _indexed(deltas, delta, "data", i),
                "offset": offset,
                "length": length,
            }
        if columns["changed"][i] is not None:
            row["changed"] = columns["changed"][i]
        rows.append(row)
    return rows


def _paths(document: dict[str, Any], key: str) -> list[Any]:
    entries = document.get(key, [])
    if not isinstance(entries, list):
        raise ManifestInvalid(f"{key} must be a list")
    return [entry.get("path") if isinstance(entry, dict) else None for entry in entries]


def _indexed(paths: list[Any], index: Any, column: str, row: int) -> Any:
    if type(index) is not int or not 0 <= index < len(paths):
        raise ManifestInvalid("v2 tensor column names no listed file", column=column, row=row)
    return paths[index]
