"""A tiny trainer without torch: a Full, then deltas, published to a ``file://`` bucket.

The operator's tests and ``bench/propagation`` run ``noop``-engine replicas, whose real
sidecars fetch, verify and rebuild every snapshot of the project's format before the
noop engine "loads" it: a corrupt delta is caught exactly as on a GPU. Each step changes
a few elements of one small tensor, so deltas are real deltas of the format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from hotload.api import API_VERSION, SnapshotKind
from hotload.snapshot import (
    MANIFEST_NAME,
    ManifestCheckpoint,
    encode,
    manifest_digest,
    read_manifest,
)
from hotload.snapshot.publish import publish_snapshot
from hotload.storage import open_storage


@dataclass(frozen=True)
class TinySnapshot:
    identity: str
    step: int
    kind: SnapshotKind
    previous: str | None
    files: tuple[str, ...]
    digest: str | None = None
    """The rebuilt weights' tensor-set digest, declared in the PolicySnapshot's spec (as the
    publisher declares it)."""
    checkpoint: tuple[str, str] | None = None
    """Deltas only: the checkpoint its spec names, (the Full's identity, the snapshot it
    is of)."""

    def policy_snapshot(self, deployment: str) -> dict[str, Any]:
        """The PolicySnapshot a trainer applies for it."""
        spec: dict[str, Any] = {
            "deploymentRef": {"name": deployment},
            "identity": self.identity,
            "step": self.step,
            "kind": self.kind.value,
        }
        if self.previous is not None:
            spec["incremental"] = {"previousIdentity": self.previous}
            if self.checkpoint is not None:
                identity, of = self.checkpoint
                spec["incremental"]["checkpoint"] = {"identity": identity, "of": of}
        if self.digest is not None:
            spec["digest"] = self.digest
        return {
            "apiVersion": API_VERSION,
            "kind": "PolicySnapshot",
            "metadata": {"name": self.identity},
            "spec": spec,
        }


class TinyChain:
    """Publishes snapshots of a 32x32 float32 "model" whose weights move a little each step."""

    def __init__(self, bucket_dir: Path, workdir: Path, name: str = "tiny") -> None:
        self.bucket_dir = bucket_dir
        self.workdir = workdir
        self.name = name
        self._rng = np.random.default_rng(7)
        self._weights = self._rng.standard_normal((32, 32)).astype(np.float32)
        self._last: tuple[TinySnapshot, Path] | None = None
        self._checkpoint: tuple[str, str] | None = None

    def _save(self, step: int) -> Path:
        model = self.workdir / f"{self.name}-model-{step:05d}"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 32}))
        save_file({"layer.weight": self._weights}, str(model / "model.safetensors"))
        return model

    async def publish(self, step: int, *, full: bool = False) -> TinySnapshot:
        """Move the weights one step and publish a Full (or a delta on the last one)."""
        if self._last is not None:
            rows = self._rng.integers(0, 32, size=4)
            self._weights[rows, rows] += np.float32(0.01)
        model = self._save(step)
        previous = None if full or self._last is None else self._last
        kind = SnapshotKind.FULL if previous is None else SnapshotKind.INCREMENTAL
        identity = f"{self.name}-s{step:05d}-{'full' if previous is None else 'delta'}"
        out = self.workdir / f"{identity}-encoded"
        encode(
            previous[1] if previous else None,
            model,
            out,
            identity=identity,
            step=step,
            previous_identity=previous[0].identity if previous else None,
            checkpoint=(
                ManifestCheckpoint(identity=self._checkpoint[0], of=self._checkpoint[1])
                if previous is not None and self._checkpoint is not None
                else None
            ),
        )
        storage = open_storage(f"file://{self.bucket_dir}")
        try:
            await publish_snapshot(storage, out, identity)
        finally:
            await storage.aclose()
        files = tuple(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
        if previous is None:
            self._checkpoint = None  # a new chain: the old one's checkpoint is not of it
        snapshot = TinySnapshot(
            identity, step, kind, previous[0].identity if previous else None, files,
            manifest_digest(read_manifest(out)),
            self._checkpoint if previous is not None else None,
        )  # fmt: skip
        self._last = (snapshot, model)
        return snapshot

    async def checkpoint(self) -> tuple[str, str]:
        """Publish beside the chain a Full of the last snapshot's weights (in the bucket
        only, no PolicySnapshot, as the publisher does) and name it in every later delta's
        spec and manifest (v5): (the checkpoint's identity, the snapshot it is of)."""
        if self._last is None:
            raise ValueError("a checkpoint is of a published snapshot: publish one first")
        of, model = self._last
        identity = f"{self.name}-s{of.step:05d}-full"
        out = self.workdir / f"{identity}-encoded"
        encode(None, model, out, identity=identity, step=of.step)
        storage = open_storage(f"file://{self.bucket_dir}")
        try:
            await publish_snapshot(storage, out, identity)
        finally:
            await storage.aclose()
        self._checkpoint = (identity, of.identity)
        return self._checkpoint

    def corrupt(self, snapshot: TinySnapshot) -> Path:
        """Flip a byte in one of the snapshot's stored files in the bucket (not its manifest)."""
        stored = [f for f in snapshot.files if f != MANIFEST_NAME]
        path = self.bucket_dir / snapshot.identity / stored[0]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        return path
