"""One digest over an engine's own per-parameter checksums.

SGLang's ``/weights_checker`` and vLLM's ``/weight_checker`` hash the parameters the
engine holds after loading — fused (``qkv_proj``, ``gate_up_proj``), sharded per tensor-
parallel rank, possibly quantised — so their checksums can never be compared with a
snapshot's files, only with another checksum from the same engine and layout: the same
snapshot loaded again must give the same digest, another snapshot a different one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def checksums_digest(checksums: Mapping[str, str]) -> str:
    """SGLang's ``overall_checksum``: sha256 over each name then its checksum, by name."""
    digest = hashlib.sha256()
    for name in sorted(checksums):
        digest.update(name.encode())
        digest.update(checksums[name].encode())
    return digest.hexdigest()
