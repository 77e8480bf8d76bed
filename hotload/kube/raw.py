"""A Kubernetes call's answer as plain JSON, without the client's generated models.

With ``_preload_content=False`` the clients hand back the raw HTTP response. Decoding it
with ``json.loads`` costs a few hundredths of a millisecond for a pod; the generated
``V1Pod`` model costs about a millisecond, and the operator (a 1,000-pod list) and the
sidecars (a pod read back or patched by every replica of a fleet, a thousand of them in
one process under the local runtime's shared mode) would pay that on every call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio.client import ApiException


async def read_json(call: Awaitable[Any]) -> dict[str, Any]:
    """The response of a ``_preload_content=False`` call as JSON; a non-2xx answer raises
    the client's ``ApiException`` (as a preloaded call would: :func:`kube_errors` maps it).

    (Without preloading, the client does not check the status: that check is ours.)
    """
    response = await call
    try:
        payload = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = payload
        raise error
    document = json.loads(payload) if payload else {}
    return document if isinstance(document, dict) else {}
