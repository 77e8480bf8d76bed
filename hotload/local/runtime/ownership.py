"""Which pods are the runtime's, and how each of their containers runs.

A pod with at least one container whose ``command[0]`` is ``hotload`` is ours
(CONTRACTS.md: recognised by the command, never the image); its other containers run
when their image is one the runtime runs from the cache (the real vLLM); kwok's stages are
configured not to touch such pods, so the runtime alone writes their status and
finishes their deletion. Pods are plain dicts as the apiserver sends them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from hotload.api.labels import INSTANCE_LABEL
from hotload.api.pod import ANNOTATION_RUNTIME, ENV_DEPLOYMENT, RUNTIME_SHARED
from hotload.local.runtime.images import local_image

OUR_COMMAND: Final = "hotload"

Pod = Mapping[str, Any]
"""A pod as the apiserver sends it (JSON object)."""


class ContainerMode(StrEnum):
    PROCESS = "process"
    """A local process running the container's ``hotload ...`` command."""
    SHARED_AGENT = "shared-agent"
    """The sidecar agent, as an asyncio task in the deployment's shared host."""
    SHARED_ENGINE = "shared-engine"
    """The ``noop`` engine of a shared pod: it lives inside its agent."""
    IMAGE = "image"
    """Another command, in an image the runtime runs from a virtualenv of the cache
    (:mod:`hotload.local.runtime.images`: the real vLLM)."""
    UNSUPPORTED = "unsupported"
    """Not ours (another command): waits with reason ``UnsupportedCommand``."""


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    mode: ContainerMode
    message: str = ""


def container_command(container: Mapping[str, Any]) -> list[str]:
    command = container.get("command") or []
    return [str(part) for part in command]


def is_our_container(container: Mapping[str, Any]) -> bool:
    command = container_command(container)
    return bool(command) and command[0] == OUR_COMMAND


def is_ours(pod: Pod) -> bool:
    """True for a pod the runtime runs (at least one container of ours)."""
    containers: Sequence[Mapping[str, Any]] = pod.get("spec", {}).get("containers") or []
    return any(is_our_container(container) for container in containers)


def _is_sidecar(container: Mapping[str, Any]) -> bool:
    return container_command(container)[:2] == [OUR_COMMAND, "sidecar"]


def _is_noop_engine(container: Mapping[str, Any]) -> bool:
    return container_command(container)[:3] == [OUR_COMMAND, "engine", "noop"]


def wants_shared(pod: Pod) -> bool:
    """The pod asked for the shared mode and fits it: one sidecar, one noop engine."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if annotations.get(ANNOTATION_RUNTIME) != RUNTIME_SHARED:
        return False
    containers = pod.get("spec", {}).get("containers") or []
    sidecars = [c for c in containers if _is_sidecar(c)]
    engines = [c for c in containers if _is_noop_engine(c)]
    return len(sidecars) == 1 and len(engines) == 1 and len(containers) == 2


def plan_containers(pod: Pod) -> list[ContainerPlan]:
    """How each container of the pod runs, in spec order."""
    shared = wants_shared(pod)
    plans: list[ContainerPlan] = []
    for container in pod.get("spec", {}).get("containers") or []:
        name = str(container.get("name", ""))
        if not is_our_container(container) and local_image(str(container.get("image", ""))):
            plans.append(ContainerPlan(name, ContainerMode.IMAGE))
        elif not is_our_container(container):
            command = " ".join(container_command(container)) or "(image entrypoint)"
            plans.append(
                ContainerPlan(
                    name,
                    ContainerMode.UNSUPPORTED,
                    f"the local pod runtime runs only hotload commands; "
                    f"this container's command is {command!r} (image {container.get('image')!r})",
                )
            )
        elif shared and _is_sidecar(container):
            plans.append(ContainerPlan(name, ContainerMode.SHARED_AGENT))
        elif shared:
            plans.append(ContainerPlan(name, ContainerMode.SHARED_ENGINE))
        else:
            plans.append(ContainerPlan(name, ContainerMode.PROCESS))
    return plans


def deployment_of(pod: Pod) -> str:
    """The RolloutDeployment a shared pod belongs to: its sidecar's ``HOTLOAD_DEPLOYMENT``
    value, else the ``app.kubernetes.io/instance`` label, else the pod's own name."""
    for container in pod.get("spec", {}).get("containers") or []:
        for entry in container.get("env") or []:
            if entry.get("name") == ENV_DEPLOYMENT and "value" in entry:
                return str(entry["value"])
    labels = pod.get("metadata", {}).get("labels") or {}
    return str(labels.get(INSTANCE_LABEL) or pod["metadata"]["name"])


def pod_key(pod: Pod) -> str:
    metadata = pod["metadata"]
    return f"{metadata.get('namespace', 'default')}/{metadata['name']}"
