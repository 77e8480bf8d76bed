"""Cooperative cancellation of blocking work that runs in threads.

``asyncio.to_thread`` gives up *waiting* when its task is cancelled, but the thread runs
on: a cancelled download kept writing its part file, a cancelled rebuild kept patching a
buffer, while the next load had already started on the same files. Here a cancelled
await instead tells the thread to stop (a :class:`CancelToken` the work checks at each
chunk) and waits until it has returned, so when the cancellation reaches the caller
nothing of that job runs any more and its files are its successor's.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Cancelled(Exception):
    """Raised inside a thread's work at a chunk boundary once its token was cancelled."""


class CancelToken:
    """A thread-safe flag: set by the event loop, checked by work in threads."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise :class:`Cancelled` once cancelled (call it between chunks)."""
        if self._event.is_set():
            raise Cancelled("the job was cancelled")


async def run_in_thread(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``func`` in a thread; if the awaiting task is cancelled, wait for the thread to
    return before the cancellation propagates (short steps: a part write, a rename)."""
    return await _run(None, functools.partial(func, *args, **kwargs))


async def run_cancellable(
    token: CancelToken, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """Like :func:`run_in_thread` for long work that checks ``token``: a cancellation
    cancels the token, so the work stops at its next chunk, and waits for that."""
    return await _run(token, functools.partial(func, *args, **kwargs))


async def _run(token: CancelToken | None, call: Callable[[], T]) -> T:
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    future = loop.run_in_executor(None, context.run, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if token is not None:
            token.cancel()
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                continue
            except BaseException:
                break
        if future.done() and not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log it as never retrieved
        raise
