"""Encode one step in the publisher's work directory: write its weights directory (the
base of the next delta), then the snapshot (a Full, or a delta against the previous
snapshot's weights kept there)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hotload.publish.state import WorkDir
from hotload.publish.weights import CapturedWeights, materialize
from hotload.snapshot import EncodeResult, ManifestCheckpoint, encode


@dataclass(frozen=True)
class EncodedStep:
    result: EncodeResult
    weights: Path
    """The step's weights directory (kept as the base of the next delta)."""
    directory: Path
    """The encoded snapshot, as it is uploaded."""
    seconds: float
    """Time spent encoding (writing the weights directory not included)."""


@dataclass(frozen=True)
class EncodeSettings:
    files_from: Path | None
    ignored_config_fields: tuple[str, ...]
    threads: int


def encode_step(
    workdir: WorkDir,
    captured: CapturedWeights,
    *,
    identity: str,
    step: int,
    previous: tuple[str, Path] | None,
    settings: EncodeSettings,
    checkpoint: ManifestCheckpoint | None = None,
) -> EncodedStep:
    """Blocking (run it in a thread). ``previous``: the delta's base (identity, weights);
    ``checkpoint``: the one a delta names (v5)."""
    weights = workdir.weights(identity)
    materialize(captured, weights, settings.files_from)
    encoded_dir = workdir.encoded(identity)
    if encoded_dir.exists():
        shutil.rmtree(encoded_dir)
    started = time.monotonic()
    result = encode(
        previous[1] if previous else None,
        weights,
        encoded_dir,
        identity=identity,
        step=step,
        previous_identity=previous[0] if previous else None,
        ignored_config_fields=settings.ignored_config_fields,
        threads=settings.threads,
        checkpoint=checkpoint if previous else None,
    )
    return EncodedStep(result, weights, encoded_dir, time.monotonic() - started)
