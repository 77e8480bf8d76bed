"""A strict reader (and a small writer) of the safetensors container, without torch.

The codec works on raw safetensors bytes, so it parses the header itself and checks it
harder than a loader needs to: the header is size-capped, valid UTF-8 JSON without
duplicate keys, every tensor has a known dtype, a shape whose byte size matches its
offsets, and the offsets tile the data section exactly (no holes, no overlaps, nothing
past the end). Any violation is :class:`~hotload.errors.DecodeFailed`.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hotload.errors import DecodeFailed, SizeLimitExceeded
from hotload.snapshot.dtypes import DType, dtype_named
from hotload.snapshot.limits import MAX_DIMS, MAX_HEADER_BYTES, MAX_NAME_BYTES, MAX_TENSORS

_PREFIX = struct.Struct("<Q")
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header declares it; ``begin``/``end`` are absolute offsets."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed header: tensors in file order, metadata, and where the data starts."""

    header_bytes: bytes
    """The JSON exactly as stored (padding included), for a byte-exact rebuild."""
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, str]
    file_size: int

    @property
    def data_start(self) -> int:
        return _PREFIX.size + len(self.header_bytes)

    def by_name(self) -> dict[str, TensorInfo]:
        return {tensor.name: tensor for tensor in self.tensors}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DecodeFailed("safetensors header repeats a key", key=key[:80])
        result[key] = value
    return result


def parse_header(header_bytes: bytes, file_size: int, *, source: str = "") -> SafetensorsHeader:
    """Validate ``header_bytes`` (the JSON after the 8-byte length) for a file of ``file_size``."""
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise SizeLimitExceeded("safetensors header over its limit", file=source)
    try:
        raw = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise DecodeFailed("safetensors header is not UTF-8 JSON", file=source) from err
    if not isinstance(raw, dict):
        raise DecodeFailed("safetensors header is not a JSON object", file=source)
    metadata = raw.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise DecodeFailed("safetensors __metadata__ must map strings to strings", file=source)
    if len(raw) > MAX_TENSORS:
        raise SizeLimitExceeded("too many tensors in one file", file=source, limit=MAX_TENSORS)
    data_start = _PREFIX.size + len(header_bytes)
    data_size = file_size - data_start
    if data_size < 0:
        raise DecodeFailed("safetensors file shorter than its header", file=source)
    entries = [_tensor_info(name, spec, data_start, source) for name, spec in raw.items()]
    entries.sort(key=lambda t: (t.begin, t.end))
    cursor = data_start
    for tensor in entries:
        if tensor.begin != cursor:
            raise DecodeFailed(
                "safetensors data offsets leave a hole or overlap",
                file=source,
                tensor=tensor.name,
            )
        cursor = tensor.end
    if cursor != file_size:
        raise DecodeFailed(
            "safetensors data offsets do not cover the file exactly",
            file=source,
            expected=file_size - data_start,
            found=cursor - data_start,
        )
    return SafetensorsHeader(bytes(header_bytes), tuple(entries), dict(metadata), file_size)


def _tensor_info(name: str, spec: Any, data_start: int, source: str) -> TensorInfo:
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES or not name:
        raise DecodeFailed("tensor name empty or too long", file=source, tensor=name[:80])
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise DecodeFailed("tensor entry must have dtype, shape, data_offsets", tensor=name)
    dtype_name, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype_name, str):
        raise DecodeFailed("tensor dtype is not a string", file=source, tensor=name)
    dtype = dtype_named(dtype_name, tensor=name)
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise DecodeFailed("tensor shape is not a list of sizes", file=source, tensor=name)
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise DecodeFailed("tensor data_offsets malformed", file=source, tensor=name)
    begin, end = offsets
    if (end - begin) != math.prod(shape) * dtype.width:
        raise DecodeFailed(
            "tensor byte size disagrees with its shape and dtype",
            file=source,
            tensor=name,
            expected=math.prod(shape) * dtype.width,
            found=end - begin,
        )
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


def read_header(path: Path) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at ``path``."""
    with path.open("rb") as handle:
        return read_header_from(handle, path.stat().st_size, source=path.name)


def read_header_from(handle: BinaryIO, file_size: int, *, source: str = "") -> SafetensorsHeader:
    prefix = handle.read(_PREFIX.size)
    if len(prefix) != _PREFIX.size:
        raise DecodeFailed("safetensors file shorter than its length prefix", file=source)
    (length,) = _PREFIX.unpack(prefix)
    if length > MAX_HEADER_BYTES:
        raise SizeLimitExceeded("safetensors header over its limit", file=source, declared=length)
    if _PREFIX.size + length > file_size:
        raise DecodeFailed("safetensors header runs past the end of the file", file=source)
    header_bytes = handle.read(length)
    if len(header_bytes) != length:
        raise DecodeFailed("safetensors header truncated", file=source)
    return parse_header(header_bytes, file_size, source=source)


def build_header(
    tensors: Iterable[tuple[str, DType, tuple[int, ...]]],
    metadata: Mapping[str, str] | None = None,
) -> tuple[bytes, list[tuple[int, int]]]:
    """A header for ``tensors`` stored in the given order; returns it and each data range.

    The JSON is compact and space-padded to a multiple of 8 bytes, as safetensors'
    own writer does, so the data section starts aligned.
    """
    document: dict[str, Any] = {}
    if metadata:
        document[METADATA_KEY] = dict(metadata)
    ranges: list[tuple[int, int]] = []
    cursor = 0
    for name, dtype, shape in tensors:
        size = math.prod(shape) * dtype.width
        document[name] = {
            "dtype": dtype.name,
            "shape": list(shape),
            "data_offsets": [cursor, cursor + size],
        }
        ranges.append((cursor, cursor + size))
        cursor += size
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return text, ranges


def length_prefix(header_bytes: bytes) -> bytes:
    """The 8-byte little-endian length that precedes a header in the file."""
    return _PREFIX.pack(len(header_bytes))
