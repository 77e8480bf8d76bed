"""The tiny Llama's trainer for the rollout of real vLLM replicas: snapshots in a bucket.

Fulls, deltas (encoded against the previous model directory, so the sidecar rebuilds
them), a LoRA adapter of the base, and a Full vLLM cannot load (a valid file, one tensor
of the wrong shape: the project's checks pass, the engine's reload refuses it), each
encoded with hotload's own encoder and published to a ``file://`` bucket, manifest last.
"""

from __future__ import annotations

from pathlib import Path

from hotload.api import SnapshotKind
from hotload.snapshot import encode
from hotload.snapshot.publish import publish_snapshot
from hotload.storage import open_storage
from tests.fixtures import tiny_llama
from tests.integration.operator.tiny_chain import TinySnapshot


class LlamaChain:
    """Publishes the tiny Llama's snapshots; deltas build on the last good model."""

    def __init__(self, bucket_dir: Path, workdir: Path, name: str = "llama") -> None:
        self.bucket_dir = bucket_dir
        self.workdir = workdir
        self.name = name
        self.steps = tiny_llama.LlamaSteps()
        self.step = 0
        self._base: tuple[TinySnapshot, Path] | None = None
        """The last Full or delta the next delta is made against (never a LoRA or a bad Full)."""

    async def publish(self, how: str) -> TinySnapshot:
        """``how``: ``full``, ``delta``, ``lora`` or ``bad`` (a Full with a wrong shape)."""
        self.step += 1
        step = self.step
        model = self.workdir / f"model-{step:03d}"
        previous: tuple[TinySnapshot, Path] | None = None
        if how == "lora":
            tiny_llama.lora_adapter(model)
            kind = SnapshotKind.LORA
        elif how == "bad":
            weights = {k: v.copy() for k, v in self.steps.weights.items()}
            weights["lm_head.weight"] = weights["lm_head.weight"][:512]
            tiny_llama.model_files(model, weights)
            kind = SnapshotKind.FULL
        else:
            self.steps.train_step()
            self.steps.files(model)
            previous = self._base if how == "delta" else None
            kind = SnapshotKind.INCREMENTAL if previous is not None else SnapshotKind.FULL
        identity = f"{self.name}-s{step:03d}-{kind.value.lower()}"
        out = self.workdir / f"{identity}-encoded"
        encode(
            previous[1] if previous else None,
            model,
            out,
            identity=identity,
            step=step,
            previous_identity=previous[0].identity if previous else None,
        )
        storage = open_storage(f"file://{self.bucket_dir}")
        try:
            await publish_snapshot(storage, out, identity)
        finally:
            await storage.aclose()
        files = tuple(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
        snapshot = TinySnapshot(
            identity, step, kind, previous[0].identity if previous else None, files
        )
        if how in ("full", "delta"):
            self._base = (snapshot, model)
        return snapshot
