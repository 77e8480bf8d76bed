"""Where a shared host's CPU goes when N noop-engine sidecars load one tiny delta.

``bench/propagation`` runs every replica's sidecar as a task of one Python process (the
pod runtime's shared mode), so the per-replica CPU cost of a delta load multiplies by the
replica count. This profiler isolates the load itself, without a control plane: N
staging areas, each with the real :class:`~hotload.sidecar.loader.SnapshotLoader` and
:class:`~hotload.sidecar.handover.Handover` (the agent's own code for plan, fetch,
verify, rebuild and swap) on a ``file://`` bucket of the tiny chain, all in one event
loop with the same default thread pool a shared host has. It loads the Full everywhere,
then profiles the delta's load everywhere (the event loop's thread and the pool's
threads), and prints the CPU seconds per replica and the top functions.

Run (from the repository root, with the project's venv)::

    python bench/propagation/profile_load.py --replicas 200 [--top 40]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry  # noqa: E402

from hotload.api import KvCachePolicy, SnapshotRef, Transition  # noqa: E402
from hotload.cancellation import CancelToken  # noqa: E402
from hotload.engines import NoopEngine  # noqa: E402
from hotload.sidecar.handover import Handover  # noqa: E402
from hotload.sidecar.loader import LoadTimings, SnapshotLoader  # noqa: E402
from hotload.sidecar.metrics import AgentMetrics  # noqa: E402
from hotload.sidecar.planning import choose_build  # noqa: E402
from hotload.sidecar.staging import StagingArea  # noqa: E402
from hotload.sidecar.swap_gate import SwapGate  # noqa: E402
from hotload.storage import open_storage  # noqa: E402
from tests.integration.operator.tiny_chain import TinyChain, TinySnapshot  # noqa: E402

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def _profile_thread() -> None:
    """Executor initializer: each pool thread profiles itself."""
    profile = cProfile.Profile()
    with _lock:
        _profiles.append(profile)
    profile.enable()


class Replica:
    def __init__(self, root: Path, bucket: Path) -> None:
        self.staging = StagingArea(root)
        self.metrics = AgentMetrics(CollectorRegistry(auto_describe=True))
        self.engine = NoopEngine()
        self.loader = SnapshotLoader(
            open_storage(f"file://{bucket}"),
            self.staging,
            self.metrics,
            concurrency=8,
            part_size=8 * 1024 * 1024,
            decode_threads=2,
            on_phase=lambda _: None,
            on_bytes=lambda _a, _b: None,
        )
        self.gate = SwapGate(self.metrics, hold_timeout_s=120.0, retry_after_s=1)

    async def load(self, snapshot: TinySnapshot) -> None:
        buffers = await asyncio.to_thread(self.staging.buffers)
        target = SnapshotRef(
            identity=snapshot.identity,
            step=snapshot.step,
            kind=snapshot.kind,
            kv_cache_policy=KvCachePolicy.ALL,
        )
        served_slot = buffers.served
        into = buffers.free_slot()
        assert into is not None
        served = buffers.held(served_slot)
        options = await self.loader.options(target, buffers.held(into), served)
        choice = choose_build(options, fresh=False)
        base = (served_slot, served) if served_slot is not None and served is not None else None
        timings = LoadTimings()
        built = await self.loader.build(target, choice, into, base, timings, CancelToken())
        handover = Handover(
            self.engine, self.staging, self.gate, self.metrics, drain_timeout_s=60.0
        )
        await handover.hand(
            into,
            built.staged,
            served=served_slot,
            transition=Transition.ASYNC,
            cache_policy=None,
            on_swapping=lambda: None,
        )
        await asyncio.to_thread(self.staging.clean_fetches, {built.staged.identity})
        assert self.engine._identity == snapshot.identity


async def main_async(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    work = Path(tempfile.mkdtemp(prefix="hotload-profile-load-", dir=args.dir))
    chain = TinyChain(work / "bucket", work / "trainer")
    full = await chain.publish(0, full=True)
    replicas = [Replica(work / f"staging-{i}", work / "bucket") for i in range(args.replicas)]
    for replica in replicas:
        await asyncio.to_thread(replica.staging.prepare)
    await asyncio.gather(*(r.load(full) for r in replicas))
    for step in range(1, args.warmup + 1):
        snapshot = await chain.publish(step)
        await asyncio.gather(*(r.load(snapshot) for r in replicas))
    delta = await chain.publish(args.warmup + 1)
    if args.profile:
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=args.threads, initializer=_profile_thread)
        )
        main = cProfile.Profile()
        _profiles.append(main)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if args.profile:
        main.enable()
    await asyncio.gather(*(r.load(delta) for r in replicas))
    if args.profile:
        main.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    note = ", profiled" if args.profile else ""
    print(
        f"{args.replicas} replicas, one delta: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"({cpu / args.replicas * 1000:.1f} ms CPU per replica{note})"
    )
    if args.profile:
        out = io.StringIO()
        stats = pstats.Stats(_profiles[0], stream=out)
        for profile in _profiles[1:]:
            profile.disable()
            stats.add(profile)
        stats.sort_stats(args.sort).print_stats(args.top)
        print(out.getvalue())
        if args.dump:
            stats.dump_stats(args.dump)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument(
        "--warmup", type=int, default=2, help="Deltas loaded before the measured one."
    )
    parser.add_argument(
        "--threads", type=int, default=6, help="The pool's threads (a 2-core host's default)."
    )
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--dump", default=None)
    parser.add_argument("--dir", default=None, help="Where the staging areas live.")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
