"""A Hugging Face ``Trainer`` (TRL's trainers are subclasses) trains a tiny model for real
and publishes through ``HotloadCallback`` every two optimizer steps.

Real training (the reference engine's tiny Qwen2, AdamW, gradient accumulation), a real
publisher against the session's region (a ``file://`` bucket, the PolicySnapshots
applied), the snapshots rebuilt from the bucket.
Would catch: publishing per micro-batch instead of per optimizer step, a step skipped or
published twice, the last step left unpublished, publishes still in flight when
training returns, snapshots that do not rebuild to the trained weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from kubernetes import client as k8s
from transformers import Trainer, TrainingArguments

from hotload.api import SnapshotKind
from hotload.engines.reference import model as rm
from hotload.engines.reference import tokenizer
from hotload.local import LocalRegions
from hotload.local.trainer import CORPUS
from hotload.publish import Publisher, PublisherSettings, RegionOutcome
from hotload.publish.trainer_callback import HotloadCallback
from hotload.snapshot import rebuild
from hotload.snapshot.tensor_files import mapped_shards

pytestmark = pytest.mark.cluster

WINDOW = 32


class Windows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Next-token windows over the corpus (the labels are the inputs: the model shifts)."""

    def __init__(self) -> None:
        self.tokens = torch.tensor(tokenizer.encode(CORPUS * 4), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.tokens) // WINDOW - 1

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.tokens[index * WINDOW : (index + 1) * WINDOW]
        return {"input_ids": window, "labels": window}


def test_a_trainer_publishes_every_two_optimizer_steps_and_its_last(
    local_regions: LocalRegions,
    kube_clients: dict[str, k8s.ApiClient],
    namespace: str,
    tmp_path: Path,
) -> None:
    region = local_regions.regions[0].name
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    k8s.CustomObjectsApi(kube_clients[region]).create_namespaced_custom_object(
        "hotload.dev", "v1alpha1", namespace, "rolloutdeployments",
        {
            "apiVersion": "hotload.dev/v1alpha1",
            "kind": "RolloutDeployment",
            "metadata": {"name": "cb"},
            "spec": {
                "model": {"name": "tiny", "servedName": "policy"},
                "engine": {"kind": "noop"},
                "replicas": 0,
                "hotLoad": {"bucketUrl": f"file://{bucket}"},
            },
        },
    )  # fmt: skip
    model = rm.build_model(rm.build_config("tiny"), seed=0)
    model.requires_grad_(True)  # build_model hands out the seeded weights frozen
    canonical = list(rm.parameters(model))

    def select(state: Any) -> dict[str, Any]:
        return {name: state[name] for name in canonical}  # tied aliases left out

    settings = PublisherSettings(
        deployment="cb",
        contexts=(region,),
        workdir=tmp_path / "publisher",
        namespace=namespace,
        kubeconfig=local_regions.kubeconfig,
        identity_prefix="cb",
        files_from=rm.save_snapshot(model, tmp_path / "model"),
        dtype="bfloat16",
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=5,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    with Publisher(settings) as publisher:
        callback = HotloadCallback(publisher, every=2, select=select)
        Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[callback]).train()
        # wait_at_end: nothing is in flight once train() returned
        assert all(handle.done() for handle in callback.handles)
    results = callback.results()
    assert [r.step for r in results] == [2, 4, 5]
    assert [r.kind for r in results] == [
        SnapshotKind.FULL,
        SnapshotKind.INCREMENTAL,
        SnapshotKind.INCREMENTAL,
    ]
    assert all(r.regions[region].outcome is RegionOutcome.APPLIED for r in results)
    previous: Path | None = None
    for result in results:
        out = tmp_path / "rebuilt" / result.identity
        rebuild(previous, bucket / result.identity, out)
        previous = out
    assert previous is not None
    trained = rm.state_for_snapshot(model, torch.bfloat16)
    with mapped_shards(previous, ["model.safetensors"]) as index:
        assert sorted(index.by_name) == sorted(trained)
        for name, tensor in trained.items():
            shard, info = index.by_name[name]
            expected = tensor.reshape(-1).view(torch.int16).numpy().tobytes()
            assert bytes(shard.raw(info)) == expected, name
