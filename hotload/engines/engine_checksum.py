"""One digest over an engine's own per-parameter checksums.

SGLang's ``/weights_checker`` and vLLM's ``/weight_checker`` hash the parameters the
engine holds after loading — fused (``qkv_proj``, ``gate_up_proj``), sharded per tensor-
parallel rank, possibly quantised — so their checksums can never be compared with a
snapshot's files, only with another checksum from the same engine and layout: the same
snapshot loaded again must give the same digest, another snapshot a different one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from hotload.api.kinds import Identity
from hotload.errors import EngineRejected

log = logging.getLogger(__name__)


def checksums_digest(checksums: Mapping[str, str]) -> str:
    """SGLang's ``overall_checksum``: sha256 over each name then its checksum, by name."""
    digest = hashlib.sha256()
    for name in sorted(checksums):
        digest.update(name.encode())
        digest.update(checksums[name].encode())
    return digest.hexdigest()


class ChecksumLedger:
    """The engine checksum each snapshot had when it was loaded and checked, to compare
    later loads of the same snapshot with (``spec.engine.verifyDigest``).

    SGLang's and vLLM's checksums cannot be compared with the snapshot's files, but the
    same files loaded into the same engine layout give the same checksum: a reload of a
    snapshot after a failed load or an engine restart is verified when it matches what
    that snapshot gave before, and refused when it does not.
    """

    def __init__(self, engine: str, *, keep: int = 16) -> None:
        self._engine = engine
        self._keep = keep
        self._by_identity: dict[Identity, str] = {}
        self._last: tuple[str, str] | None = None

    def check(self, identity: Identity, checksum: str, *, url: str) -> None:
        """Record ``checksum`` for ``identity``; ``EngineRejected`` when it differs from
        the one recorded for it before (the engine serves other weights than then)."""
        known = self._by_identity.get(identity)
        if known is not None and known != checksum:
            raise EngineRejected(
                f"{self._engine} serves other weights than when {identity} was last "
                "loaded and checked (its weights checksum differs)",
                url=url,
                identity=identity,
                expected=known,
                found=checksum,
            )
        if self._last is not None and self._last[0] != identity and self._last[1] == checksum:
            log.warning(
                "the engine's weights checksum did not change with a new snapshot "
                "(identical weights, or a load that did not take)",
                extra={"engine": self._engine, "snapshot": identity, "previous": self._last[0]},
            )
        self._by_identity.pop(identity, None)
        self._by_identity[identity] = checksum
        while len(self._by_identity) > self._keep:
            del self._by_identity[next(iter(self._by_identity))]
        self._last = (identity, checksum)
