"""The reference engine's delta patch in one process: idle and while tokens stream.

``run_swap_bench`` measures target → Ready end to end (a region, a pod, the sidecar);
this measures only the engine's share, in process, so that changes to the patch can be
compared in a minute: real AdamW steps of the trainer (``--lr``) on the bench's model,
real deltas from the encoder, the real :class:`ReferenceRuntime`. For each delta it
reports the patch's seconds with the engine idle and with one generation streaming
tokens (the longest token gap during the patch less the median gap is the pause), and
the engine's floor (its load of the snapshot's directory) in both conditions.

    ~/.cache/hotload/venv/bin/python -m bench.swap.profile_patch \
        --size bench/swap/model-144m.json --deltas 3 --lr 1e-6 [--cache DIR] [--profile]
        [--portable-decode] [--split]

``--portable-decode`` keeps the context codec's native kernel on its portable loop (no
AVX2): the baseline of the AVX2 decode, run the same way. ``--split`` prints, per delta,
the thread-seconds of the patch's parts (decoding and writing the changes, summed over
the decode threads; the tensors' hash checks; the spare's catch-up on its own thread).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import functools
import json
import pstats
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotload.api import SnapshotKind
from hotload.engines.reference import model as rm
from hotload.engines.reference import spare
from hotload.engines.reference.runtime import GenerationRequest, GenerationStats, ReferenceRuntime
from hotload.engines.reference.tokenizer import encode as tokens_of
from hotload.local.trainer import PolicyTrainer
from hotload.snapshot import encode, patching
from hotload.snapshot.codec import context_kernels

SPLIT: collections.defaultdict[str, float] = collections.defaultdict(float)
_SPLIT_LOCK = threading.Lock()


def _timed_part(part: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, adding its seconds to ``SPLIT[part]`` (from any thread)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            with _SPLIT_LOCK:
                SPLIT[part] += time.perf_counter() - started

    return wrapper


def split_parts() -> None:
    """Time the patch's parts where they run (module functions, looked up at call time)."""
    patching._apply = _timed_part("decode+write", patching._apply)  # type: ignore[assignment]
    patching._check_patched = _timed_part("hash", patching._check_patched)  # type: ignore[assignment]
    spare.CatchUp.tensor = _timed_part("catch-up", spare.CatchUp.tensor)  # type: ignore[method-assign]


def fixtures(size: str, lr: float, deltas: int, cache: Path) -> list[tuple[Path, Path]]:
    """(weights directory, snapshot directory) per step: step 0's snapshot is its weights
    (loaded as a directory), the others are deltas against the step before."""
    made = cache / "made.json"
    steps = [(cache / f"weights-{i}", cache / f"delta-{i}") for i in range(deltas + 1)]
    if made.exists() and json.loads(made.read_text()) == {"size": size, "lr": lr, "n": deltas}:
        return steps
    cache.mkdir(parents=True, exist_ok=True)
    trainer = PolicyTrainer(cache / "trainer", None, name="p", size=size, lr=lr)
    trainer.model_files(steps[0][0])
    for i in range(1, deltas + 1):
        trainer.train_step()
        trainer.model_files(steps[i][0])
        encode(
            steps[i - 1][0],
            steps[i][0],
            steps[i][1],
            identity=f"p-{i}",
            step=i,
            previous_identity=f"p-{i - 1}",
        )
    made.write_text(json.dumps({"size": size, "lr": lr, "n": deltas}))
    return steps


class Stream:
    """One greedy generation streaming tokens; notes when each arrives."""

    def __init__(self, runtime: ReferenceRuntime) -> None:
        self.runtime = runtime
        self.stamps: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            request = GenerationRequest(tuple(tokens_of("A trainer publishes")), max_tokens=400)
            async for _ in self.runtime.generate(request, GenerationStats()):
                self.stamps.append(time.perf_counter())

    async def __aenter__(self) -> Stream:
        self._task = asyncio.create_task(self._run())
        while len(self.stamps) < 8:
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def pause(self, start: float, end: float) -> tuple[float, float]:
        """(longest gap touching [start, end] less the median gap, median gap)."""
        pairs = list(zip(self.stamps, self.stamps[1:], strict=False))
        gaps = [b - a for a, b in pairs]
        during = [b - a for a, b in pairs if b >= start and a <= end]
        median = statistics.median(gaps)
        return max(0.0, max(during, default=median) - median), median


async def timed(call: Any, stream: Stream | None) -> dict[str, float]:
    if stream is not None:
        await asyncio.sleep(0.3)  # a few tokens before
    started = time.perf_counter()
    report = await call
    ended = time.perf_counter()
    out = {"seconds": ended - started, "patch_s": report.read_seconds}
    if stream is not None:
        await asyncio.sleep(0.3)  # the gap after the swap closes
        out["pause_s"], out["median_gap_s"] = stream.pause(started, ended)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    steps = fixtures(args.size, args.lr, args.deltas, args.cache)
    runtime = ReferenceRuntime(rm.build_config(args.size), patch_nice=args.nice)
    runtime.load_initial(steps[0][0], "p-0")
    results: dict[str, Any] = {"deltas": [], "floor": []}
    profiler = cProfile.Profile() if args.profile else None
    for condition in ("idle", "streaming"):
        # back to step 0 through a directory load (measured as the engine's floor)
        stream = Stream(runtime) if condition == "streaming" else None
        async with stream if stream is not None else _Nothing():
            for _ in range(args.floors):
                floor = await timed(runtime.load(steps[0][0], "p-0", SnapshotKind.FULL), stream)
                results["floor"].append({"condition": condition, **floor})
            for i in range(1, args.deltas + 1):
                if profiler is not None and condition == "streaming":
                    profiler.enable()
                SPLIT.clear()
                done = await timed(runtime.apply_delta(steps[i][1], f"p-{i}"), stream)
                if profiler is not None:
                    profiler.disable()
                if SPLIT:
                    done["split_s"] = {part: round(s, 4) for part, s in SPLIT.items()}
                results["deltas"].append({"condition": condition, "delta": i, **done})
                print(json.dumps(results["deltas"][-1]), flush=True)
        print(json.dumps([f for f in results["floor"] if f["condition"] == condition]))
    digest = await runtime.tensor_digest()
    results["digest_is_manifests"] = digest is not None
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return results


class _Nothing:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *_: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="bench/swap/model-144m.json")
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--floors", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/hotload-profile-patch"))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--nice", type=int, default=0, help="the patch thread's nice")
    parser.add_argument(
        "--portable-decode", action="store_true", help="the context kernel without AVX2"
    )
    parser.add_argument("--split", action="store_true", help="time the patch's parts")
    args = parser.parse_args()
    if args.split:
        split_parts()
    if args.portable_decode:
        context_kernels.decode_chunk = functools.partial(  # type: ignore[assignment]
            context_kernels.decode_chunk, simd=False
        )
    print(json.dumps({"portable_decode": args.portable_decode, "simd": context_kernels.SIMD}))
    results = asyncio.run(run(args))
    for condition in ("idle", "streaming"):
        deltas = [d for d in results["deltas"] if d["condition"] == condition]
        floors = [f for f in results["floor"] if f["condition"] == condition]
        line = {
            "condition": condition,
            "delta_s_median": statistics.median(d["seconds"] for d in deltas),
            "floor_s_median": statistics.median(f["seconds"] for f in floors),
        }
        if condition == "streaming":
            line["pause_s_median"] = statistics.median(d["pause_s"] for d in deltas)
            line["pause_s_max"] = max(d["pause_s"] for d in deltas)
            line["floor_pause_s_median"] = statistics.median(f["pause_s"] for f in floors)
        print(json.dumps(line))


if __name__ == "__main__":
    main()
