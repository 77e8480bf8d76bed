"""Every size limit of the format in one place (docs/snapshot-format.md, "Limits").

A decoder checks declared sizes against these *before* it allocates or decompresses,
so a hostile manifest or header cannot make it reserve memory it was never promised.
"""

from __future__ import annotations

from typing import Final

MAX_MANIFEST_BYTES: Final = 64 * 1024 * 1024
"""A manifest larger than this is refused unread (a 7B model's manifest is ~100 KiB)."""

MAX_HEADER_BYTES: Final = 100 * 1024 * 1024
"""Safetensors' own cap on its JSON header."""

MAX_TENSORS: Final = 1_000_000
"""Tensors in one snapshot."""

MAX_PARTS: Final = 1_000_000
"""Parts of tensors in one snapshot (and of one tensor)."""

MAX_FILES: Final = 100_000
"""Files (stored plus referenced) in one snapshot."""

MAX_PATH_BYTES: Final = 1024
"""A relative path inside a snapshot, UTF-8 encoded."""

MAX_NAME_BYTES: Final = 1024
"""A tensor name, UTF-8 encoded."""

MAX_DIMS: Final = 16
"""Dimensions of one tensor."""

MAX_TENSOR_BYTES: Final = 1 << 40
"""Bytes of one tensor (1 TiB): a bound on every allocation a tensor entry can ask for."""

MAX_CHUNK_ELEMENTS: Final = 1 << 24
"""Elements of one chunk: bounds the memory one decode thread holds."""

DEFAULT_CHUNK_ELEMENTS: Final = 1 << 20
"""What the encoder writes unless told otherwise (2 MiB of bf16 per chunk)."""

MAX_CONFIG_BYTES: Final = 16 * 1024 * 1024
"""config.json is read whole to compare it with the previous one."""
