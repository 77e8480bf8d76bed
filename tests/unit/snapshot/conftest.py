from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hotload.snapshot import EncodeResult, encode, encode_full, rebuild
from hotload.snapshot.codec.tensor_codec import CodecOptions

from .models import base_tensors, next_step, write_model


@dataclass(frozen=True)
class Chain:
    """A Full (s1), its rebuild, and a delta (s2) against it, in a temporary directory."""

    root: Path
    v1: Path
    v2: Path
    full: EncodeResult
    delta: EncodeResult
    rebuilt_v1: Path

    @property
    def snapshot(self) -> Path:
        return self.delta.path


SMALL_CHUNKS = CodecOptions(chunk_elements=256)


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    v1_tensors = base_tensors()
    v1 = write_model(tmp_path / "v1", {"model.safetensors": v1_tensors})
    v2 = write_model(tmp_path / "v2", {"model.safetensors": next_step(v1_tensors)})
    full = encode_full(v1, tmp_path / "s1", identity="s1", step=1)
    rebuilt_v1 = tmp_path / "r1"
    rebuild(None, full.path, rebuilt_v1)
    delta = encode(
        rebuilt_v1,
        v2,
        tmp_path / "s2",
        identity="s2",
        step=2,
        previous_identity="s1",
        options=SMALL_CHUNKS,
    )
    return Chain(tmp_path, v1, v2, full, delta, rebuilt_v1)


def leftovers(directory: Path) -> list[str]:
    """Temporary names a failed write would have left behind."""
    return sorted(p.name for p in directory.iterdir() if ".partial-" in p.name)
