"""Join the ranks of a ``torch.distributed`` job as one sharded publisher.

Every rank constructs its :class:`~hotload.publish.Publisher` with the same settings and
``distributed=True`` (or a ``process_group``: the ranks that publish together; default,
every rank of the job). Rank 0 of that group is the coordinator: it alone talks to the
regions (its kube contexts, the state in ``workdir``); every rank keeps its own blocks in
``workdir/ranks/<rank>/``. The ranks talk through the job's key-value store, never its
process groups (see :mod:`~hotload.publish.rank_channel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hotload.errors import ConfigError
from hotload.publish.rank_channel import KeyValueStore


@dataclass(frozen=True)
class RankInfo:
    member: int
    """This rank's number in the publisher's group (0: the coordinator)."""
    members: int
    store: KeyValueStore

    @property
    def coordinator(self) -> bool:
        return self.member == 0


def join_ranks(namespace: str, deployment: str, process_group: Any | None) -> RankInfo:
    """This process's place among the publishing ranks (torch.distributed must be
    initialised), and the store under the deployment's prefix."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore, _get_default_store

    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError("a distributed publisher needs torch.distributed initialised first")
    group = process_group if process_group is not None else dist.group.WORLD
    member = dist.get_rank(group)
    if member < 0:
        raise ConfigError("this process is not in the publisher's process group")
    store = PrefixStore(f"hotload/{namespace}/{deployment}/", _get_default_store())
    # The store takes bytes as well as str (its stub says str only).
    return RankInfo(member, dist.get_world_size(group), cast(KeyValueStore, store))


def rank_root(workdir: Path, member: int) -> Path:
    return workdir.expanduser().absolute() / "ranks" / f"{member:05d}"
