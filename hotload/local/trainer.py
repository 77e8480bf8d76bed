"""A trainer at toy scale: the reference model trained for real, snapshots published.

It is the trainer of DESIGN.md's Flow step 1 for the demo, the tests and the benchmarks:
fp32 master weights of the reference engine's architecture, AdamW on a genuine next-token
loss over a small built-in text (or :meth:`PolicyTrainer.perturb`, an RL-like update
without backprop for big models), and after each step an inference-ready bf16 snapshot
encoded as a Full or a lossless delta against the one before, uploaded with the manifest
last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from hotload.api import KvCachePolicy, PolicySnapshot, SnapshotKind, SnapshotRef
from hotload.api.kinds import Identity
from hotload.engines.reference import model as reference_model
from hotload.engines.reference import tokenizer
from hotload.errors import ConfigError
from hotload.snapshot import ManifestCheckpoint, encode
from hotload.snapshot.publish import publish_snapshot
from hotload.storage import Storage

log = logging.getLogger(__name__)

#: What the demo's policy learns to continue (a genuine language-modelling loss).
CORPUS: Final = (
    "A trainer publishes policy snapshots to object storage: a full checkpoint now and "
    "then, small lossless deltas in between. In every region a weight-swap sidecar fetches "
    "them, verifies every checksum, rebuilds the weights beside live serving, and swaps "
    "them into the running engine without a restart. Nothing half-loaded is ever served. "
)
WINDOW: Final = 48
BATCH: Final = 4


@dataclass(frozen=True)
class PublishedSnapshot:
    identity: Identity
    step: int
    kind: SnapshotKind
    previous: str | None
    weights: Path
    """The bf16 directory the snapshot encodes (what every replica must end up serving)."""
    stored_bytes: int
    full_bytes: int
    """Bytes of the full weights' tensor data (the numerator of the compression ratio)."""
    loss: float
    files: tuple[str, ...] = ()
    """Its keys under ``<identity>/``, in upload order (the manifest last)."""

    @property
    def ratio(self) -> float:
        return self.full_bytes / self.stored_bytes if self.stored_bytes else 0.0

    def policy_snapshot(self, deployment: str) -> PolicySnapshot:
        """The PolicySnapshot the trainer applies to every region."""
        spec: dict[str, object] = {
            "deploymentRef": {"name": deployment},
            "identity": self.identity,
            "step": self.step,
            "kind": self.kind.value,
        }
        if self.previous is not None:
            spec["incremental"] = {"previousIdentity": self.previous}
        return PolicySnapshot.model_validate({"metadata": {"name": self.identity}, "spec": spec})

    def ref(self, policy: KvCachePolicy = KvCachePolicy.ALL) -> SnapshotRef:
        """What a RolloutDeployment's ``status.targetSnapshot`` says about it."""
        return SnapshotRef(
            identity=self.identity, step=self.step, kind=self.kind, kv_cache_policy=policy
        )


class PolicyTrainer:
    """fp32 master weights and AdamW; bf16 snapshots published to ``storage`` (or handed to
    a :class:`hotload.publish.Publisher` through :meth:`inference_state`)."""

    def __init__(
        self,
        workdir: Path,
        storage: Storage | None = None,
        *,
        name: str,
        size: str = "tiny",
        lr: float = 1e-5,
        seed: int = 0,
    ) -> None:
        self.workdir = workdir
        self.storage = storage
        self.name = name
        self.model_config = size
        """What the reference engine needs to serve this model (``--model-config``)."""
        self.config = reference_model.build_config(size)
        self.model = reference_model.build_model(self.config, seed=seed)
        self.model.train()
        self.model.requires_grad_(True)
        self._optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self._generator = torch.Generator().manual_seed(seed + 1)
        self._tokens = torch.tensor(tokenizer.encode(CORPUS * 4), dtype=torch.long)
        self.step = 0
        self.last_loss = float("nan")
        self.published: list[PublishedSnapshot] = []
        self._extra_files: dict[str, bytes] = {}

    def train_step(self) -> float:
        """One AdamW step of next-token loss on random windows of the corpus."""
        starts = torch.randint(
            0, len(self._tokens) - WINDOW, (BATCH,), generator=self._generator
        ).tolist()
        batch = torch.stack([self._tokens[s : s + WINDOW] for s in starts])
        loss = self.model(input_ids=batch, labels=batch).loss
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        self.step += 1
        self.last_loss = float(loss.detach())
        return self.last_loss

    def perturb(self, fraction: float = 0.03) -> None:
        """An RL-like update without the cost of backprop (benchmarks on big models):
        ``fraction`` of the bf16 weights move by one ULP, the rest stay bit-identical
        (DESIGN.md: ~99% unchanged at RL learning rates, ~3-5% deltas)."""
        dtype = reference_model.storage_dtype(self.config)
        with torch.no_grad():
            for param in reference_model.parameters(self.model).values():
                stored = param.detach().to(dtype).contiguous()
                bits = stored.view(torch.int16).flatten()
                chosen = torch.rand(bits.numel(), generator=self._generator) < fraction
                signs = torch.randint(0, 2, (bits.numel(),), generator=self._generator) * 2 - 1
                bits[chosen] += signs[chosen].to(torch.int16)
                param.copy_(bits.view(dtype).view_as(param).to(param.dtype))
        self.step += 1

    def inference_state(self) -> dict[str, torch.Tensor]:
        """The weights a snapshot of this step holds (the storage dtype, canonical names):
        what a training loop hands to ``Publisher.publish``."""
        return reference_model.state_for_snapshot(
            self.model, reference_model.storage_dtype(self.config)
        )

    def model_files(self, directory: Path) -> Path:
        """A model directory of the current weights (config.json beside them): the
        ``files_from`` of a publisher fed with :meth:`inference_state`."""
        return reference_model.save_snapshot(self.model, directory)

    def identity_for(self, step: int, kind: SnapshotKind) -> str:
        return f"{self.name}-step-{step}"

    async def publish_full(
        self, *, extra_files: Mapping[str, bytes] | None = None
    ) -> PublishedSnapshot:
        """Publish a Full; ``extra_files`` (relative path → bytes) travel in the snapshot
        beside the weights, as a tokenizer or notes would."""
        return await self.publish(full=True, extra_files=extra_files)

    async def publish_delta(
        self, *, checkpoint: ManifestCheckpoint | None = None
    ) -> PublishedSnapshot:
        """A delta against the last published; ``checkpoint``: the one it names (v5)."""
        if not self.published:
            raise ValueError("a delta needs a snapshot before it")
        return await self.publish(full=False, checkpoint=checkpoint)

    async def publish_checkpoint(self, of: PublishedSnapshot) -> PublishedSnapshot:
        """A Full of ``of``'s weights published beside the chain (``…-checkpoint``): not
        one of ``published``, named by the deltas after it that say so."""
        identity = f"{of.identity}-checkpoint"
        encoded = self.workdir / "encoded" / identity
        result = await asyncio.to_thread(
            encode, None, of.weights, encoded, identity=identity, step=of.step
        )
        if self.storage is None:
            raise ConfigError("this trainer has no storage to publish to", trainer=self.name)
        keys = await publish_snapshot(self.storage, encoded, identity)
        return PublishedSnapshot(
            identity=identity,
            step=of.step,
            kind=SnapshotKind.FULL,
            previous=None,
            weights=of.weights,
            stored_bytes=result.stored_bytes,
            full_bytes=result.tensor_bytes,
            loss=of.loss,
            files=tuple(key.removeprefix(f"{identity}/") for key in keys),
        )

    async def publish(
        self,
        *,
        full: bool,
        extra_files: Mapping[str, bytes] | None = None,
        checkpoint: ManifestCheckpoint | None = None,
    ) -> PublishedSnapshot:
        """Publish the current weights: a Full, or a delta against the last published
        (carrying the files the snapshot before it carried)."""
        previous = None if full or not self.published else self.published[-1]
        kind = SnapshotKind.INCREMENTAL if previous else SnapshotKind.FULL
        identity = self.identity_for(self.step, kind)
        weights = self.workdir / "weights" / identity
        encoded = self.workdir / "encoded" / identity
        await asyncio.to_thread(self.model_files, weights)
        extra = dict(extra_files) if extra_files is not None else dict(self._extra_files)
        for relpath, data in extra.items():
            (weights / relpath).parent.mkdir(parents=True, exist_ok=True)
            (weights / relpath).write_bytes(data)
        self._extra_files = extra
        result = await asyncio.to_thread(
            encode,
            previous.weights if previous else None,
            weights,
            encoded,
            identity=identity,
            step=self.step,
            previous_identity=previous.identity if previous else None,
            checkpoint=checkpoint if previous else None,
        )
        if self.storage is None:
            raise ConfigError("this trainer has no storage to publish to", trainer=self.name)
        keys = await publish_snapshot(self.storage, encoded, identity)
        published = PublishedSnapshot(
            identity=identity,
            step=self.step,
            kind=kind,
            previous=previous.identity if previous else None,
            weights=weights,
            stored_bytes=result.stored_bytes,
            full_bytes=result.tensor_bytes,
            loss=self.last_loss,
            files=tuple(key.removeprefix(f"{identity}/") for key in keys),
        )
        self.published.append(published)
        log.info(
            "published",
            extra={"snapshot": identity, "kind": kind.value, "stored_bytes": result.stored_bytes},
        )
        return published
