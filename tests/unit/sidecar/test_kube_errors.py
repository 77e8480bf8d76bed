"""The one mapping of Kubernetes client exceptions to hotload's typed errors."""

from __future__ import annotations

import aiohttp
import pytest
from kubernetes.client.exceptions import ApiException as SyncApiException
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

from hotload.errors import KubeConflict, KubeError, KubeExpired, KubeForbidden, KubeNotFound
from hotload.kube import kube_errors, map_api_exception


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (403, KubeForbidden),
        (401, KubeForbidden),
        (404, KubeNotFound),
        (409, KubeConflict),
        (410, KubeExpired),
        (500, KubeError),
    ],
)
@pytest.mark.parametrize("exception", [AsyncApiException, SyncApiException])
def test_statuses_map_to_their_classes_for_both_clients(
    status: int, kind: type[KubeError], exception: type[Exception]
) -> None:
    err = exception(status=status, reason="Why")
    mapped = map_api_exception(err, pod="p-0")
    assert type(mapped) is kind
    assert mapped.status == status and mapped.context["pod"] == "p-0"


def test_the_apiservers_message_is_kept() -> None:
    err = AsyncApiException(status=403, reason="Forbidden")
    err.body = b'{"kind":"Status","message":"pods \\"x\\" is forbidden: no patch"}'
    assert "no patch" in str(map_api_exception(err))


def test_transport_failures_are_transient_kube_errors() -> None:
    with pytest.raises(KubeError) as raised, kube_errors(what="watch"):
        raise aiohttp.ClientConnectionError("refused")
    assert type(raised.value) is KubeError and raised.value.transient
    assert not KubeForbidden("x").transient
