"""A container's environment and command line, built the way a kubelet builds them.

Order (later wins): a small base taken from the runtime's own environment (``PATH``,
``HOME``, locale: enough for our console script to run; never the runtime's own
``KUBECONFIG`` or credentials), then ``envFrom``, then ``env`` (values, downward-API
``fieldRef``/``resourceFieldRef``, ``secretKeyRef``, ``configMapKeyRef``), then the
runtime's world: ``KUBECONFIG`` (the pod-bound token), ``KUBERNETES_SERVICE_HOST`` and
``_PORT`` (the apiserver on 127.0.0.1, never a ClusterIP) and ``HOTLOAD_ROOT``. Those
last ones win because a pod written for a real cluster never means them for this host.
One more is translated, not replaced: a loopback ``HOTLOAD_ENGINE_HOST`` (the engine
listening inside its pod only) becomes the pod's own IP, because here every pod shares the
host's network namespace and the pod's IP is the one loopback address that is its alone.

``$(VAR)`` in env values, command and args expands as in Kubernetes: a defined variable
is replaced, ``$$`` is a literal ``$``, anything else stays as written. Pure functions:
Secrets and ConfigMaps come in already read (:class:`ApiSources`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hotload.api.pod import ENV_ENGINE_HOST
from hotload.errors import ContainerConfigInvalid

#: Host variables a container inherits (a container image would set these itself).
BASE_ENV_NAMES: Final = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "HOTLOAD_CACHE",
    "HOTLOAD_LOG_LEVEL",
    "HOTLOAD_SHARED_HOST_SCHEDULE",
)
_ENV_NAME: Final = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


@dataclass(frozen=True)
class ApiSources:
    """Secrets and ConfigMaps a pod refers to, read from the API (None: not found)."""

    secrets: Mapping[str, Mapping[str, str] | None] = field(default_factory=dict)
    config_maps: Mapping[str, Mapping[str, str] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class PodFacts:
    """What the downward API can tell about a pod, with the runtime's address for it."""

    pod: Mapping[str, Any]
    pod_ip: str
    host_ip: str


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion."""
    out: list[str] = []
    cursor = 0
    while cursor < len(text):
        char = text[cursor]
        if char != "$" or cursor + 1 >= len(text):
            out.append(char)
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "$":
            out.append("$")
            cursor += 2
        elif following == "(":
            closing = text.find(")", cursor + 2)
            if closing == -1:
                out.append("$(")
                cursor += 2
                continue
            name = text[cursor + 2 : closing]
            out.append(variables.get(name, f"$({name})"))
            cursor = closing + 1
        else:
            out.append("$" + following)
            cursor += 2
    return "".join(out)


def referenced_sources(pod: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the Secrets and ConfigMaps a pod's env, envFrom and volumes refer to."""
    secrets: set[str] = set()
    config_maps: set[str] = set()
    spec = pod.get("spec", {})
    for container in spec.get("containers") or []:
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                secrets.add(source["secretRef"]["name"])
            if "configMapRef" in source:
                config_maps.add(source["configMapRef"]["name"])
        for entry in container.get("env") or []:
            value_from = entry.get("valueFrom") or {}
            if "secretKeyRef" in value_from:
                secrets.add(value_from["secretKeyRef"]["name"])
            if "configMapKeyRef" in value_from:
                config_maps.add(value_from["configMapKeyRef"]["name"])
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            secrets.add(volume["secret"]["secretName"])
        if "configMap" in volume:
            config_maps.add(volume["configMap"]["name"])
        for projection in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in projection:
                secrets.add(projection["secret"]["name"])
            if "configMap" in projection:
                config_maps.add(projection["configMap"]["name"])
    return secrets, config_maps


def field_value(facts: PodFacts, field_path: str) -> str:
    """The downward API's value for ``field_path`` (the fields Kubernetes allows in env)."""
    metadata = facts.pod.get("metadata", {})
    spec = facts.pod.get("spec", {})
    simple: dict[str, Any] = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace", "default"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if field_path in simple:
        return str(simple[field_path] or "")
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if match:
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigInvalid("unsupported downward API field in env", field_path=field_path)


def _resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """``resourceFieldRef``: the container's own limit or request, when it sets one."""
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    divisor = str(ref.get("divisor", "1"))
    if value is None or divisor not in ("1", "0"):
        raise ContainerConfigInvalid(
            "resourceFieldRef needs the container to set that resource (divisor 1 only)",
            resource=resource,
            divisor=divisor,
        )
    return str(value)


def _key_ref(
    kind: str,
    ref: Mapping[str, Any],
    objects: Mapping[str, Mapping[str, str] | None],
) -> str | None:
    """A Secret's or ConfigMap's key; None when optional and absent."""
    name = str(ref.get("name", ""))
    key = str(ref.get("key", ""))
    optional = bool(ref.get("optional", False))
    data = objects.get(name)
    if data is None:
        if optional:
            return None
        raise ContainerConfigInvalid(f"{kind} {name!r} not found", kind=kind, name=name)
    if key not in data:
        if optional:
            return None
        raise ContainerConfigInvalid(
            f"key {key!r} not found in {kind} {name!r}", kind=kind, name=name, key=key
        )
    return data[key]


def _from_sources(container: Mapping[str, Any], sources: ApiSources, env: dict[str, str]) -> None:
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        if "secretRef" in source:
            kind, ref, objects = "Secret", source["secretRef"], sources.secrets
        elif "configMapRef" in source:
            kind, ref, objects = "ConfigMap", source["configMapRef"], sources.config_maps
        else:
            continue
        data = objects.get(str(ref.get("name", "")))
        if data is None:
            if ref.get("optional", False):
                continue
            raise ContainerConfigInvalid(f"{kind} {ref.get('name')!r} not found", kind=kind)
        for key, value in data.items():
            name = prefix + key
            if _ENV_NAME.match(name):
                env[name] = value


def container_env(
    container: Mapping[str, Any],
    facts: PodFacts,
    sources: ApiSources,
    *,
    base: Mapping[str, str],
    world: Mapping[str, str],
) -> dict[str, str]:
    """The environment a container's process starts with."""
    env: dict[str, str] = {name: base[name] for name in BASE_ENV_NAMES if name in base}
    _from_sources(container, sources, env)
    for entry in container.get("env") or []:
        name = str(entry["name"])
        value_from = entry.get("valueFrom")
        if value_from is None:
            env[name] = _pod_local(name, expand(str(entry.get("value", "")), env), facts)
            continue
        value: str | None
        if "fieldRef" in value_from:
            value = field_value(facts, str(value_from["fieldRef"]["fieldPath"]))
        elif "resourceFieldRef" in value_from:
            value = _resource_value(container, value_from["resourceFieldRef"])
        elif "secretKeyRef" in value_from:
            value = _key_ref("Secret", value_from["secretKeyRef"], sources.secrets)
        elif "configMapKeyRef" in value_from:
            value = _key_ref("ConfigMap", value_from["configMapKeyRef"], sources.config_maps)
        else:
            raise ContainerConfigInvalid(
                "unsupported valueFrom in env", variable=name, keys=sorted(value_from)
            )
        if value is not None:
            env[name] = value
    env.update(world)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _pod_local(name: str, value: str, facts: PodFacts) -> str:
    """A loopback ``HOTLOAD_ENGINE_HOST`` is the pod's own IP here (module docstring)."""
    return facts.pod_ip if name == ENV_ENGINE_HOST and _is_loopback(value) else value


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names the pod's loopback (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def container_argv(
    container: Mapping[str, Any], env: Mapping[str, str], executable: str
) -> list[str]:
    """``command`` + ``args`` expanded; ``hotload`` becomes our console script's path."""
    command: Sequence[Any] = container.get("command") or []
    args: Sequence[Any] = container.get("args") or []
    argv = [expand(str(part), env) for part in [*command, *args]]
    if argv and argv[0] == "hotload":
        argv[0] = executable
    return argv
