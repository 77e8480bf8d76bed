"""A tiny Full snapshot (a config and one small safetensors file), published to a bucket.

Enough for agents with the ``noop`` engine to fetch, verify and "load" a real snapshot
of the project's format, without torch: the runtime's tests and its scale benchmark
use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from hotload.api import KvCachePolicy, SnapshotKind, SnapshotRef
from hotload.snapshot import encode_full
from hotload.snapshot.publish import publish_snapshot
from hotload.storage import open_storage


async def publish_tiny_full(
    bucket_dir: Path, workdir: Path, identity: str, step: int
) -> SnapshotRef:
    """Encode and publish a Full snapshot under ``file://<bucket_dir>/<identity>/``."""
    model = workdir / f"{identity}-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 8}))
    rng = np.random.default_rng(step)
    save_file(
        {"layer.weight": rng.standard_normal((8, 8)).astype(np.float32)},
        str(model / "model.safetensors"),
    )
    encoded = workdir / f"{identity}-snapshot"
    encode_full(model, encoded, identity=identity, step=step)
    storage = open_storage(f"file://{bucket_dir}")
    try:
        await publish_snapshot(storage, encoded, identity)
    finally:
        await storage.aclose()
    return SnapshotRef(
        identity=identity, step=step, kind=SnapshotKind.FULL, kv_cache_policy=KvCachePolicy.ALL
    )
