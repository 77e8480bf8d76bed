"""Read which weights produced a response or chunk, from whatever fields an engine uses.

- reference: ``hotload_identities`` (list, in order) and ``hotload_identity`` on every
  response and chunk;
- SGLang: ``meta_info.weight_versions`` (``[{version, start, end}]``) when the version
  changed during the request, else ``meta_info.weight_version``;
- vLLM: per choice ``weight_versions`` when the request set ``return_weight_versions``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def ordered_unique(versions: Iterable[object]) -> list[str]:
    """Drop empties and consecutive repeats; keep the order."""
    result: list[str] = []
    for version in versions:
        if isinstance(version, Mapping):
            version = version.get("version") or version.get("weight_version")
        if version is None or version == "":
            continue
        text = str(version)
        if not result or result[-1] != text:
            result.append(text)
    return result


def _versions_in(node: Mapping[str, Any]) -> list[str]:
    many = node.get("weight_versions")
    if isinstance(many, list) and many:
        return ordered_unique(many)
    one = node.get("weight_version")
    if isinstance(one, str | int) and one != "":
        return [str(one)]
    return []


def weight_versions(payload: Mapping[str, Any]) -> list[str]:
    """Versions named at the top level, in ``meta_info``, or in a choice (or its meta_info)."""
    found: list[object] = []
    for node in (payload, payload.get("meta_info")):
        if isinstance(node, Mapping):
            found.extend(_versions_in(node))
    choices = payload.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, Mapping):
                found.extend(_versions_in(choice))
                meta = choice.get("meta_info")
                if isinstance(meta, Mapping):
                    found.extend(_versions_in(meta))
    return ordered_unique(found)


def reference_identities(payload: Mapping[str, Any]) -> list[str]:
    """The reference engine's own fields."""
    many = payload.get("hotload_identities")
    if isinstance(many, list) and many:
        return ordered_unique(many)
    one = payload.get("hotload_identity")
    return [one] if isinstance(one, str) and one else []
