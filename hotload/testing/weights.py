"""The fake engines' weights: real tensors read from a snapshot directory, held as bytes.

The fakes do not run a model; what matters for the contract is *which bytes* are served
and how a load can go wrong. A load replaces tensors one at a time, in name order, the
way both released engines load into live parameters (vLLM's ``reload_weights`` layer by
layer, SGLang's ``update_weights_from_disk`` parameter by parameter): a failure midway
leaves some tensors new and the rest old, which is exactly why a failed load on those
engines leaves the weights unknown. Checksums are sha256 per tensor over its raw bytes
(vLLM's ``/weight_checker`` shape) and one digest over the sorted (name, checksum) pairs
(SGLang's ``overall_checksum``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hotload.engines.engine_checksum import checksums_digest
from hotload.errors import EngineRejected
from hotload.snapshot.safetensors_file import read_header


class LoadFailedMidway(EngineRejected):
    """A load stopped after replacing some tensors: the weights are now a mix."""


@dataclass(frozen=True)
class TensorBytes:
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def read_directory(path: Path) -> dict[str, TensorBytes]:
    """Every tensor of every ``*.safetensors`` file under ``path`` (a HF layout directory)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise EngineRejected("no *.safetensors file in the weights directory", path=str(path))
    tensors: dict[str, TensorBytes] = {}
    for file in files:
        header = read_header(file)
        with file.open("rb") as handle:
            for info in header.tensors:
                handle.seek(info.begin)
                data = handle.read(info.nbytes)
                tensors[info.name] = TensorBytes(info.dtype.name, info.shape, data)
    return tensors


class TensorStore:
    """What a fake engine serves: tensors by name, replaced in place by loads."""

    def __init__(self) -> None:
        self.tensors: dict[str, TensorBytes] = {}

    def load(
        self,
        path: Path,
        *,
        fail_after: int | None = None,
        on_tensor: Callable[[str], None] | None = None,
    ) -> int:
        """Replace tensors from ``path`` one by one (name order); how many were replaced.

        ``fail_after`` stops the load with :class:`LoadFailedMidway` once that many
        tensors were replaced (an injected fault: a bad file, an OOM halfway).
        """
        incoming = read_directory(path)
        replaced = 0
        for name in sorted(incoming):
            if fail_after is not None and replaced >= fail_after:
                raise LoadFailedMidway(
                    "load failed midway: the weights are now part old, part new",
                    path=str(path),
                    replaced=replaced,
                    total=len(incoming),
                )
            self.tensors[name] = incoming[name]
            replaced += 1
            if on_tensor is not None:
                on_tensor(name)
        return replaced

    def checksums(self) -> dict[str, str]:
        """sha256 of every tensor's bytes, by name."""
        return {name: tensor.sha256 for name, tensor in sorted(self.tensors.items())}

    def digest(self) -> str:
        """One sha256 over the sorted (name, checksum) pairs (empty store: of nothing)."""
        return checksums_digest(self.checksums())

    def scramble(self) -> None:
        """What vLLM's ``weight_checker reset`` does to real weights: overwrite them."""
        self.tensors = {
            name: TensorBytes(t.dtype, t.shape, bytes(len(t.data)))
            for name, t in self.tensors.items()
        }


def snapshot_checksums(path: Path) -> dict[str, str]:
    """What :meth:`TensorStore.checksums` reports after loading ``path`` whole."""
    return {name: t.sha256 for name, t in sorted(read_directory(path).items())}
