"""A tensor's chunk jobs: on the encoder's thread pool, or inline when there is one.

Chunks are independent, so a tensor of several encodes them on the pool. A tensor of one
chunk (most of a model's tensors: norms, biases, small projections) runs it in the
calling thread: handing one job to a pool thread and waiting for it costs more than many
such tensors take to encode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")


def map_jobs(executor: Executor | None, fn: Callable[[U], T], items: Sequence[U]) -> list[T]:
    """``[fn(item) for item in items]``, on ``executor`` when there are two or more."""
    if executor is None or len(items) < 2:
        return [fn(item) for item in items]
    return list(executor.map(fn, items))
