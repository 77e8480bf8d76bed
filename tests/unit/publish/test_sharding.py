"""What each rank of a sharded job publishes of a state_dict (two gloo processes on CPU).

Would catch: a rank's block taken at the wrong rows (FSDP's uneven ``Shard(0)``), a
``Shard(1)`` tensor published as columns (not a contiguous range of the flattened
tensor) or gathered whole, a replicated or plain tensor published twice or by nobody,
ranks choosing different owners for the same plain tensor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from hotload.publish.sharding import capture_held

WORLD = 2


def full_tensors() -> dict[str, object]:
    generator = torch.Generator().manual_seed(3)
    return {
        "rows": torch.randn(7, 5, generator=generator),
        "cols": torch.randn(4, 6, generator=generator),
        "cube": torch.randn(3, 4, 2, generator=generator),
        "replicated": torch.randn(9, generator=generator),
        "plain.big": torch.randn(6, 4, generator=generator),
        "plain.small": torch.randn(3, generator=generator),
    }


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    full = full_tensors()
    state = {
        "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
        "cols": distribute_tensor(full["cols"], mesh, [Shard(1)]),
        "cube": distribute_tensor(full["cube"], mesh, [Shard(2)]),
        "replicated": distribute_tensor(full["replicated"], mesh, [Replicate()]),
        "plain.big": full["plain.big"],
        "plain.small": full["plain.small"],
    }
    held = capture_held(state, torch.bfloat16, member=rank, members=WORLD)
    blocks = [{"name": b.name, "start": b.start, "words": b.words().tolist()} for b in held.blocks]
    metas = [[m.name, m.dtype, list(m.shape)] for m in held.metas]
    Path(out, f"{rank}.json").write_text(json.dumps({"blocks": blocks, "metas": metas}))
    dist.destroy_process_group()


def test_each_tensor_is_published_once_in_row_ranges_by_the_ranks_that_hold_it(
    tmp_path: Path,
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Forked, not spawned: the ranks start with torch already imported (seconds, where a
    # fresh interpreter per rank takes a minute on a busy machine).
    mp.start_processes(
        _rank,
        args=(f"file://{tmp_path / 'rendezvous'}", str(tmp_path)),
        nprocs=WORLD,
        start_method="fork",
    )
    views = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    full = full_tensors()
    assert views[0]["metas"] == views[1]["metas"]
    assert [m[0] for m in views[0]["metas"]] == sorted(full)
    assert {m[1] for m in views[0]["metas"]} == {"BF16"}
    for name, tensor in full.items():
        words = (
            tensor.to(torch.bfloat16).reshape(-1).view(torch.int16).numpy().view(np.uint16)  # type: ignore[attr-defined]
        )
        found = sorted(
            (b["start"], rank, b["words"])
            for rank, view in enumerate(views)
            for b in view["blocks"]
            if b["name"] == name
        )
        end = 0
        for start, _, part in found:
            assert start == end, (name, found)
            assert part == words[start : start + len(part)].tolist(), name
            end = start + len(part)
        assert end == len(words), name
        if name in ("rows", "cols", "cube"):  # sharded: every rank publishes its rows
            assert [rank for _, rank, _ in found] == [0, 1], name
        else:  # held whole everywhere: one rank publishes it
            assert len(found) == 1, name
    owners = {b["name"]: r for r, v in enumerate(views) for b in v["blocks"]}
    assert (
        owners["plain.big"] != owners["plain.small"] or owners["replicated"] != owners["plain.big"]
    )
