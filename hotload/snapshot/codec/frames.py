"""zstd frames whose decompressed size is known before they are opened.

Every frame the format stores has an exact expected size (a plane of a chunk, a
header). Decompression checks the frame's declared content size against it first, so
a frame cannot ask for more memory than the manifest promised (python-zstandard would
otherwise allocate whatever the frame declares), and then requires the frame to end
exactly where its stored length says. An empty frame stands for that many zero bytes.
"""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from hotload.errors import DecodeFailed, SizeLimitExceeded

_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = zstandard.ZstdDecompressor()
        _local.dctx = dctx
    return dctx


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "cctx", None)
    if cache is None:
        cache = {}
        _local.cctx = cache
    cctx = cache.get(level)
    if cctx is None:
        cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
        cache[level] = cctx
    return cctx


def compress_plane(plane: np.ndarray, level: int) -> bytes:
    """A frame for ``plane`` (contiguous bytes); empty when every byte is zero."""
    if not plane.any():
        return b""
    return bytes(_compressor(level).compress(plane.data))


def compress_bytes(data: bytes, level: int) -> bytes:
    """A frame for ``data`` that always declares its size (used for headers)."""
    return bytes(_compressor(level).compress(data))


def decompress_exact(frame: memoryview, size: int, *, what: str) -> bytes | None:
    """The ``size`` bytes in ``frame``; None for an empty frame (all zeros).

    :class:`SizeLimitExceeded` when the frame declares another size (or none);
    :class:`DecodeFailed` when it is corrupt, decodes to another size, or does not
    end exactly at its stored length.
    """
    if len(frame) == 0:
        return None
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError as err:
        raise DecodeFailed("not a zstd frame", what=what) from err
    if declared != size:
        raise SizeLimitExceeded(
            "zstd frame declares another size than the format allows",
            what=what,
            expected=size,
            declared=declared,
        )
    decoder = _decompressor().decompressobj()
    try:
        data = decoder.decompress(frame)
    except zstandard.ZstdError as err:
        raise DecodeFailed("corrupt zstd frame", what=what) from err
    if not decoder.eof or decoder.unused_data or len(data) != size:
        raise DecodeFailed(
            "zstd frame does not match its stored length",
            what=what,
            expected=size,
            found=len(data),
        )
    return data
