"""Read the Secrets and ConfigMaps a pod refers to, as a kubelet does before each start.

A missing object is recorded as None (``optional`` refs tolerate it, the others make the
container wait with ``CreateContainerConfigError``); any other failure (the runtime's
own access, the apiserver away) is raised as ``ContainerConfigInvalid`` so the container
waits and the start is retried.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from hotload.errors import ContainerConfigInvalid, KubeError, KubeNotFound
from hotload.local.runtime.environment import ApiSources, referenced_sources
from hotload.local.runtime.kube_rest import KubeRest


def _decoded(data: Mapping[str, str] | None) -> dict[str, str]:
    return {
        key: base64.b64decode(value).decode("utf-8", "replace")
        for key, value in (data or {}).items()
    }


async def _read(rest: KubeRest, path: str) -> dict[str, Any] | None:
    try:
        return await rest.get(path)
    except KubeNotFound:
        return None
    except KubeError as err:
        raise ContainerConfigInvalid(
            "cannot read a pod's source", path=path, error=str(err)
        ) from err


async def read_sources(rest: KubeRest, pod: Mapping[str, Any]) -> ApiSources:
    namespace = pod["metadata"].get("namespace", "default")
    secret_names, config_map_names = referenced_sources(pod)
    secrets: dict[str, Mapping[str, str] | None] = {}
    config_maps: dict[str, Mapping[str, str] | None] = {}
    for name in sorted(secret_names):
        secret = await _read(rest, f"/api/v1/namespaces/{namespace}/secrets/{name}")
        secrets[name] = None if secret is None else _decoded(secret.get("data"))
    for name in sorted(config_map_names):
        config_map = await _read(rest, f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        if config_map is None:
            config_maps[name] = None
        else:
            values = dict(config_map.get("data") or {})
            values.update(_decoded(config_map.get("binaryData")))
            config_maps[name] = values
    return ApiSources(secrets=secrets, config_maps=config_maps)
