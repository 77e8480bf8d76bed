"""The snapshot formats and file hashes hotload supports: plain names, no pydantic.

A PolicySnapshot declares its delta's ``incremental.compressionFormat`` and
``checksumFormat``; the operator judges those declarations against these lists without
reading a byte, and the snapshot codec (``hotload.snapshot``) reads and writes exactly
these formats. Both take them from here, so the operator never imports the codec.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

FORMAT_V1: Final = "hotload-delta/v1"
FORMAT_V2: Final = "hotload-delta/v2"
FORMAT_V3: Final = "hotload-delta/v3"
FORMAT_V4: Final = "hotload-delta/v4"
FORMAT_V5: Final = "hotload-delta/v5"
READABLE_FORMATS: Final = (FORMAT_V1, FORMAT_V2, FORMAT_V3, FORMAT_V4, FORMAT_V5)
"""Every format and version a reader implements, oldest first (the ``compressionFormat``
values the operator accepts)."""
WRITTEN_FORMAT: Final = FORMAT_V3
"""The format and version we write for a snapshot without parts."""
PARTS_FORMAT: Final = FORMAT_V4
"""The format of a snapshot whose tensors are stored as parts (a sharded trainer's)."""
CHECKPOINT_FORMAT: Final = FORMAT_V5
"""The format of a delta that names a checkpoint: a Full of the same weights as one of its
chain's snapshots, published beside the chain (v4's rules and the ``checkpoint`` key), so a
reader of v4 refuses such a delta instead of ignoring the key."""


class FileHash(StrEnum):
    """Hash of stored files (``checksumFormat``). We always write sha256; adler32 is
    accepted on input."""

    SHA256 = "sha256"
    ADLER32 = "adler32"
