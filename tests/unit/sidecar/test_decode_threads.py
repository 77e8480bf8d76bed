"""How many decode threads a load starts: none beyond its own for a small snapshot.

Would catch: a decode pool started (and joined) for every load of a tiny model — at 1,000
agents in one shared host that was ~6 % of its CPU for ~1.5 % of decoding — or a large
snapshot decoded on one thread.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from hotload.sidecar.loader import PARALLEL_DECODE_MIN_BYTES, decode_threads_for
from hotload.snapshot import encode, read_manifest


def _full(tmp_path: Path, shape: tuple[int, int]) -> Path:
    model = tmp_path / f"model-{shape[0]}"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    weights = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    save_file({"layer.weight": weights}, str(model / "model.safetensors"))
    out = tmp_path / f"encoded-{shape[0]}"
    encode(None, model, out, identity=f"t-{shape[0]}", step=0, previous_identity=None)
    return out


def test_a_small_snapshot_decodes_in_the_loaders_thread(tmp_path: Path) -> None:
    manifest = read_manifest(_full(tmp_path, (32, 32)))
    assert sum(shard.size for shard in manifest.shards) < PARALLEL_DECODE_MIN_BYTES
    assert decode_threads_for(manifest, 4) == 1


def test_a_large_snapshot_decodes_on_every_thread_it_may(tmp_path: Path) -> None:
    rows = PARALLEL_DECODE_MIN_BYTES // (4 * 1024)  # float32 rows of 1,024: the threshold
    manifest = read_manifest(_full(tmp_path, (rows, 1024)))
    assert sum(shard.size for shard in manifest.shards) >= PARALLEL_DECODE_MIN_BYTES
    assert decode_threads_for(manifest, 4) == 4
    assert decode_threads_for(manifest, 1) == 1
