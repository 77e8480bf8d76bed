"""The one place where Kubernetes client exceptions become hotload's typed errors.

Both clients (``kubernetes`` for sync code, ``kubernetes_asyncio`` for async code) raise
their own ``ApiException`` with the same shape: ``status``, ``reason``, ``body``. Callers
branch on our classes (:class:`~hotload.errors.KubeForbidden` for an RBAC gap,
:class:`~hotload.errors.KubeNotFound`, :class:`~hotload.errors.KubeConflict`,
:class:`~hotload.errors.KubeExpired` for a watch that must re-list), never on numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import kubernetes.client.exceptions as sync_exceptions
import urllib3.exceptions
from kubernetes_asyncio.client import exceptions as async_exceptions

from hotload.errors import (
    KubeConflict,
    KubeError,
    KubeExpired,
    KubeForbidden,
    KubeNotFound,
)

#: Both clients' exception types; they share attributes but not a base class.
API_EXCEPTIONS: tuple[type[Exception], ...] = (
    async_exceptions.ApiException,
    sync_exceptions.ApiException,
)
#: Transport failures (connection refused, reset, timeout) of either client.
TRANSPORT_EXCEPTIONS: tuple[type[Exception], ...] = (
    aiohttp.ClientError,
    urllib3.exceptions.HTTPError,
    TimeoutError,
    ConnectionError,
)

_BY_STATUS: dict[int, type[KubeError]] = {
    401: KubeForbidden,
    403: KubeForbidden,
    404: KubeNotFound,
    409: KubeConflict,
    410: KubeExpired,
}


def _status_message(body: Any) -> str | None:
    """The apiserver's human message from a Status body, when there is one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:500]
    if isinstance(parsed, dict):
        message = parsed.get("message")
        return str(message) if message else None
    return None


def map_api_exception(err: BaseException, **context: Any) -> KubeError:
    """Our error for a client exception (``ApiException`` or a transport failure)."""
    status = getattr(err, "status", None)
    if isinstance(err, API_EXCEPTIONS) and isinstance(status, int):
        kind = _BY_STATUS.get(status, KubeError)
        detail = _status_message(getattr(err, "body", None)) or str(getattr(err, "reason", ""))
        return kind(f"Kubernetes API answered {status}: {detail}".strip(), status=status, **context)
    return KubeError(f"Kubernetes API unreachable: {type(err).__name__}: {err}", **context)


@contextmanager
def kube_errors(**context: Any) -> Iterator[None]:
    """Run a block of client calls; their exceptions leave it as :class:`KubeError`."""
    try:
        yield
    except (*API_EXCEPTIONS, *TRANSPORT_EXCEPTIONS) as err:
        raise map_api_exception(err, **context) from err
