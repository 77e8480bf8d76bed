"""List, then watch from the list's resourceVersion; list again on 410 or any failure.

The consumer gets the whole set on every (re)list, so it can tell what vanished while
the watch was down, and each event after it. Bookmarks only move the version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from hotload.errors import KubeError, KubeExpired
from hotload.local.runtime.kube_rest import KubeRest
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

OnList = Callable[[list[dict[str, Any]]], None]
OnEvent = Callable[[str, dict[str, Any]], None]


async def list_and_watch(
    rest: KubeRest,
    path: str,
    on_list: OnList,
    on_event: OnEvent,
    *,
    params: Sequence[tuple[str, str]] = (),
    max_delay_s: float = 5.0,
) -> None:
    """Run until cancelled."""
    backoff = Backoff(RetryPolicy(initial_s=0.2, maximum_s=max_delay_s, jitter=0.0))
    while True:
        try:
            listing = await rest.request("GET", path, params=list(params))
            version = str(listing["metadata"]["resourceVersion"])
            on_list(list(listing.get("items") or []))
            backoff.reset()
            while True:
                async for event in rest.watch(path, resource_version=version, params=params):
                    obj = event.get("object") or {}
                    version = str(obj.get("metadata", {}).get("resourceVersion", version))
                    if event.get("type") != "BOOKMARK":
                        on_event(str(event.get("type")), obj)
        except KubeExpired:
            log.info("watch expired; listing again", extra={"path": path})
        except (ValueError, KeyError, TypeError, OSError) as err:
            # A malformed answer or a consumer's bug must not leave the runtime deaf.
            log.exception(
                "list/watch step failed; listing again", extra={"path": path, "error": repr(err)}
            )
            await backoff.wait()
        except KubeError as err:
            log.warning("list/watch failed; retrying", extra={"path": path, "error": str(err)})
            await backoff.wait()
