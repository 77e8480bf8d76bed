"""``hotload gc``: what every region still needs stays; everything else of ours goes.

Runs on real file:// buckets with real encoded snapshots; the regions are stand-ins that
answer what their RolloutDeployment and PolicySnapshots say (the same deletions against
real apiservers, one of them stopped, are tests/integration/publish/test_gc_regions.py).
Would catch: deleting a link of a chain a lagging region still replays, deleting another
publisher's prefixes, deleting a publish in flight, and deleting anything while a region
does not answer.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from hotload.api import CheckpointRef
from hotload.errors import GcRefused, KubeError
from hotload.publish.garbage import (
    GcRegion,
    Link,
    collect_garbage,
    full_step,
    group_prefixes,
    retained_snapshots,
)
from hotload.publish.region_client import RegionBucket
from hotload.snapshot import MANIFEST_NAME, ManifestCheckpoint, encode
from hotload.snapshot.publish import upload_snapshot
from hotload.storage import ObjectInfo, open_storage

from ..snapshot.models import base_tensors, next_step, write_model


def psnap(
    identity: str, previous: str | None, deployment: str = "demo", checkpoint_of: str | None = None
) -> dict[str, Any]:
    """A PolicySnapshot; ``checkpoint_of``: the delta names the checkpoint ``<of>-full``."""
    spec: dict[str, Any] = {
        "deploymentRef": {"name": deployment},
        "identity": identity,
        "step": int(identity.split("-step-")[1].split("-")[0]),
        "kind": "Incremental" if previous else "Full",
    }
    if previous:
        spec["incremental"] = {"previousIdentity": previous}
        if checkpoint_of:
            spec["incremental"]["checkpoint"] = {"identity": f"{checkpoint_of}-full",
                                                 "of": checkpoint_of}  # fmt: skip
    return {"metadata": {"name": identity}, "spec": spec}


@dataclass
class StandInRegion:
    bucket_url: str
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    answers: bool = True
    deployment: str = "demo"

    def bucket(self, endpoint_override: str | None = None) -> RegionBucket:
        if not self.answers:
            raise KubeError("Kubernetes API unreachable: connection refused")
        return RegionBucket("ctx", self.bucket_url, None, None)

    def list_snapshots(self) -> list[dict[str, Any]]:
        if not self.answers:
            raise KubeError("Kubernetes API unreachable: connection refused")
        return self.snapshots


def publish_chain(
    tmp_path: Path,
    bucket: Path,
    names: list[tuple[str, str | None]],
    checkpoints: Mapping[str, str] | None = None,
    named: Mapping[str, str] | None = None,
) -> None:
    """Encode and upload a chain of real snapshots (None previous: a Full), then each
    checkpoint (identity → the snapshot whose weights it holds): a Full beside the chain.
    ``named``: delta → the snapshot ``of`` whose checkpoint ``<of>-full`` its manifest names
    (v5)."""
    storage = open_storage(f"file://{bucket}")
    tensors = base_tensors()
    weights: dict[str, Path] = {}
    for index, (identity, previous) in enumerate(names):
        tensors = next_step(tensors, seed=index)
        weights[identity] = write_model(tmp_path / "w" / identity, {"model.safetensors": tensors})
        encoded = encode(
            weights[previous] if previous else None,
            weights[identity],
            tmp_path / "e" / identity,
            identity=identity,
            step=index,
            previous_identity=previous,
            checkpoint=(
                ManifestCheckpoint(identity=f"{named[identity]}-full", of=named[identity])
                if named and identity in named
                else None
            ),
        )
        asyncio.run(upload_snapshot(storage, encoded.path, identity))
    steps = {identity: index for index, (identity, _) in enumerate(names)}
    for identity, of in (checkpoints or {}).items():
        encoded = encode(
            None, weights[of], tmp_path / "e" / identity, identity=identity, step=steps[of]
        )
        asyncio.run(upload_snapshot(storage, encoded.path, identity))


CHAIN = [
    ("run-step-0-full", None),
    ("run-step-1", "run-step-0-full"),
    ("run-step-2", "run-step-1"),
    ("run-step-3", "run-step-2"),
    ("run-step-4-full", None),
    ("run-step-5", "run-step-4-full"),
]


def prefixes(bucket: Path) -> set[str]:
    return {path.name for path in bucket.iterdir() if path.is_dir()}


def make_old(bucket: Path) -> None:
    old = time.time() - 7200
    for path in bucket.rglob("*"):
        os.utime(path, (old, old))


def test_a_lagging_region_keeps_its_whole_chain_and_the_rest_goes(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHAIN)
    (bucket / "run-step-6").mkdir()  # an upload that died before its manifest
    (bucket / "run-step-6" / "delta-00000.safetensors").write_bytes(b"x")
    (bucket / "other-step-1").mkdir()  # another publisher's
    (bucket / "other-step-1" / MANIFEST_NAME).write_text("{}")
    make_old(bucket)
    url = f"file://{bucket}"
    regions: dict[str, GcRegion] = {
        # Up to date: its operator kept the newest Full and its delta.
        "a": StandInRegion(
            url, [psnap("run-step-4-full", None), psnap("run-step-5", "run-step-4-full")]
        ),
        # Lagging: only step 2's object is left; replaying it needs 1 and 0 (their
        # PolicySnapshots are gone, their manifests say the chain).
        "b": StandInRegion(url, [psnap("run-step-2", "run-step-1")]),
    }

    result = asyncio.run(collect_garbage(regions, prefix="run"))

    assert result.needed == [
        "run-step-0-full",
        "run-step-1",
        "run-step-2",
        "run-step-4-full",
        "run-step-5",
    ]
    assert prefixes(bucket) == {*result.needed, "other-step-1"}
    (gc,) = result.buckets
    assert sorted(gc.deleted) == ["run-step-3", "run-step-6"]
    assert gc.deleted_bytes > 0 and gc.contexts == ["a", "b"]


def test_dry_run_deletes_nothing(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHAIN[:3])
    make_old(bucket)
    regions = {"a": StandInRegion(f"file://{bucket}", [psnap("run-step-0-full", None)])}
    result = asyncio.run(collect_garbage(regions, prefix="run", dry_run=True))
    assert result.buckets[0].deleted == ["run-step-1", "run-step-2"]
    assert prefixes(bucket) == {name for name, _ in CHAIN[:3]}


def test_young_prefixes_wait_for_a_later_run(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHAIN[:2])
    regions = {"a": StandInRegion(f"file://{bucket}", [psnap("run-step-0-full", None)])}
    result = asyncio.run(collect_garbage(regions, prefix="run", min_age=timedelta(hours=1)))
    assert result.buckets[0].kept_young == ["run-step-1"]
    assert "run-step-1" in prefixes(bucket)


def test_nothing_is_deleted_while_a_region_does_not_answer(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHAIN[:2])
    make_old(bucket)
    url = f"file://{bucket}"
    regions = {
        "a": StandInRegion(url, [psnap("run-step-1", "run-step-0-full")]),
        "b": StandInRegion(url, answers=False),
    }
    with pytest.raises(GcRefused) as refused:
        asyncio.run(collect_garbage(regions, prefix="run"))
    assert "b" in refused.value.context["regions"]
    assert prefixes(bucket) == {"run-step-0-full", "run-step-1"}


def test_retained_snapshots_are_this_deployments_only() -> None:
    items = [
        psnap("run-step-1", "run-step-0-full"),
        psnap("run-step-3", "run-step-2", checkpoint_of="run-step-1"),
        psnap("run-step-0-full", None),
        psnap("x-step-1", None, deployment="other"),
        {"metadata": {"name": "broken"}, "spec": {"identity": "nope"}},
    ]
    assert retained_snapshots(items, "demo") == {
        "run-step-1": Link("run-step-0-full"),
        "run-step-3": Link(
            "run-step-2", CheckpointRef(identity="run-step-1-full", of="run-step-1")
        ),
        "run-step-0-full": Link(),
    }


#: A chain with checkpoints beside it: ``run-step-2-full`` (of step 2) is complete and
#: named by steps 3 and 4; ``run-step-4-full`` (of step 4) was just completed and no delta
#: names it yet; ``run-step-1-full`` is a checkpoint the publisher gave up on (it never
#: names one of a link older than the one it names).
CHECKPOINTED = [
    ("run-step-0-full", None),
    ("run-step-1", "run-step-0-full"),
    ("run-step-2", "run-step-1"),
    ("run-step-3", "run-step-2"),
    ("run-step-4", "run-step-3"),
]
CHECKPOINTS = {"run-step-1-full": "run-step-1", "run-step-2-full": "run-step-2",
               "run-step-4-full": "run-step-4"}  # fmt: skip


def test_a_checkpoint_is_kept_and_nothing_older_than_its_snapshot(tmp_path: Path) -> None:
    """Would catch: chains still walked back to the Full once a checkpoint is named (with
    checkpoints no new Full comes: the bucket would grow for ever), the named checkpoint
    or its ``of`` deleted, and a checkpoint no delta names yet deleted."""
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHECKPOINTED, CHECKPOINTS)
    make_old(bucket)
    url = f"file://{bucket}"
    regions: dict[str, GcRegion] = {
        "a": StandInRegion(url, [psnap("run-step-3", "run-step-2", checkpoint_of="run-step-2"),
                                 psnap("run-step-4", "run-step-3", checkpoint_of="run-step-2")]),
        "b": StandInRegion(url, [psnap("run-step-4", "run-step-3", checkpoint_of="run-step-2")]),
    }  # fmt: skip

    result = asyncio.run(collect_garbage(regions, prefix="run"))

    assert result.needed == ["run-step-2", "run-step-2-full", "run-step-3", "run-step-4"]
    (gc,) = result.buckets
    assert sorted(gc.deleted) == ["run-step-0-full", "run-step-1", "run-step-1-full"]
    assert gc.kept_recent_fulls == ["run-step-4-full"]
    assert prefixes(bucket) == {*result.needed, "run-step-4-full"}


def test_a_lagging_target_that_names_no_checkpoint_keeps_its_chain_to_the_full(
    tmp_path: Path,
) -> None:
    """Would catch: one walk cut short where another region's walk stopped at a
    checkpoint (region b's target, step 3, was published before the checkpoint was
    complete: replaying it needs steps 2, 1 and the Full, which region a's walk from step 4
    did not need)."""
    bucket = tmp_path / "bucket"
    publish_chain(tmp_path, bucket, CHECKPOINTED, {"run-step-2-full": "run-step-2"})
    make_old(bucket)
    url = f"file://{bucket}"
    regions: dict[str, GcRegion] = {
        "a": StandInRegion(url, [psnap("run-step-4", "run-step-3", checkpoint_of="run-step-2")]),
        "b": StandInRegion(url, [psnap("run-step-3", "run-step-2")]),
    }
    result = asyncio.run(collect_garbage(regions, prefix="run"))
    assert result.needed == sorted({name for name, _ in CHECKPOINTED} | {"run-step-2-full"})
    assert result.buckets[0].deleted == []


def test_a_checkpoint_named_in_a_manifest_stops_the_walk_through_the_bucket(
    tmp_path: Path,
) -> None:
    """Would catch: the manifests' ``checkpoint`` ignored where the walk goes on through the
    bucket (the retained snapshot's PolicySnapshot names none: applied by a trainer that
    does not copy it), so the old chain is kept for ever."""
    bucket = tmp_path / "bucket"
    chain = [*CHECKPOINTED, ("run-step-5", "run-step-4")]
    named = {"run-step-3": "run-step-2", "run-step-4": "run-step-2", "run-step-5": "run-step-2"}
    publish_chain(tmp_path, bucket, chain, {"run-step-2-full": "run-step-2"}, named)
    make_old(bucket)
    regions = {"a": StandInRegion(f"file://{bucket}", [psnap("run-step-5", "run-step-4")])}
    result = asyncio.run(collect_garbage(regions, prefix="run"))
    assert result.needed == [
        "run-step-2", "run-step-2-full", "run-step-3", "run-step-4", "run-step-5",
    ]  # fmt: skip
    assert sorted(result.buckets[0].deleted) == ["run-step-0-full", "run-step-1"]


@pytest.mark.parametrize(
    ("identity", "step"),
    [
        ("run-step-12-full", 12),
        ("run-step-12-checkpoint", 12),
        ("run-step-12", None),
        ("run-step-x-checkpoint", None),
        ("run-step-12-lora", None),
        ("run-step-x-full", None),
        ("run-step--full", None),
        ("run-step-\u0661-full", None),  # a digit, not an ASCII one: not the publisher's name
        ("runner-step-1-full", None),
    ],
)
def test_only_the_publishers_fulls_have_a_step(identity: str, step: int | None) -> None:
    assert full_step(identity, "run") == step


def test_prefixes_group_by_identity_and_only_ours() -> None:
    infos = [
        ObjectInfo(key, 10) for key in ("run-step-1/a", "run-step-1/b", "runner-step-1/a", "top")
    ]
    (group,) = group_prefixes(infos, "run")
    assert (group.identity, group.size) == ("run-step-1", 20)
