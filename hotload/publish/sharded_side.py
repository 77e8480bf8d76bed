"""A Publisher's side in a sharded trainer: its rank's capture, rounds and directory.

Built by :class:`~hotload.publish.Publisher` when it is one of the ranks of a
``torch.distributed`` job (torch is imported here, never by a single-process publisher).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotload.errors import ConfigError
from hotload.publish.buckets import BucketOpener
from hotload.publish.commit import Coordinator, Deliver
from hotload.publish.deciding import KindChooser
from hotload.publish.observer import PublishObserver
from hotload.publish.rank_channel import RankChannel
from hotload.publish.rank_dir import RankDir
from hotload.publish.rank_round import RankRounds, RoundSettings
from hotload.publish.ranks import RankInfo, rank_root
from hotload.publish.region_buckets import RegionBuckets
from hotload.publish.settings import PublisherSettings
from hotload.publish.sharding import HeldWeights, capture_held
from hotload.publish.state import PublisherState, WorkDir
from hotload.publish.weights import torch_dtype

CoordinatorParts = tuple[
    WorkDir, PublisherState, KindChooser, RegionBuckets, Deliver, PublishObserver
]


@dataclass
class ShardedSide:
    ranks: RankInfo
    channel: RankChannel
    rank_dir: RankDir
    rounds: RankRounds
    _full_next: threading.Event

    @classmethod
    def join(
        cls,
        settings: PublisherSettings,
        ranks: RankInfo,
        *,
        open_bucket: BucketOpener,
        coordinator_parts: CoordinatorParts,
    ) -> ShardedSide:
        channel = RankChannel(
            ranks.store,
            member=ranks.member,
            members=ranks.members,
            silence_s=settings.rank_timeout_s,
        )
        rank_dir = RankDir(rank_root(settings.workdir, ranks.member))
        coordinator = None
        if ranks.coordinator:
            workdir, state, chooser, buckets, deliver, observer = coordinator_parts
            coordinator = Coordinator(
                settings=settings,
                workdir=workdir,
                state=state,
                chooser=chooser,
                buckets=buckets,
                deliver=deliver,
                channel=channel,
                observer=observer,
            )
        rounds = RankRounds(
            channel=channel,
            rank_dir=rank_dir,
            settings=RoundSettings(settings.encode_threads, open_bucket),
            coordinator=coordinator,
        )
        return cls(ranks, channel, rank_dir, rounds, threading.Event())

    def capture(self, weights: Mapping[str, Any] | Path, dtype: str | None) -> HeldWeights:
        """This rank's blocks of a state_dict (in the training loop's thread)."""
        if isinstance(weights, Path):
            raise ConfigError(
                "a sharded publisher publishes a state_dict (DTensors and tensors), "
                "not a directory",
                directory=str(weights),
            )
        return capture_held(
            weights,
            torch_dtype(dtype) if dtype else None,
            member=self.ranks.member,
            members=self.ranks.members,
        )

    def request_full(self) -> None:
        self._full_next.set()

    def take_full_request(self) -> bool:
        wanted = self._full_next.is_set()
        self._full_next.clear()
        return wanted

    def close(self) -> None:
        self.channel.close()
        self.rank_dir.close()
