"""Read which weights produced a response or chunk, from whatever fields an engine uses.

- reference: ``hotload_identities`` (list, in order) and ``hotload_identity`` on every
  response and chunk;
- SGLang: on non-streamed ``/v1`` answers ``metadata.weight_versions``
  (``[{version, start, end}]``) when the version changed during the request, else
  ``metadata.weight_version``; ``meta_info.…`` on the native ``/generate`` route (and per
  chat choice with ``return_meta_info``); ``/v1`` stream chunks carry none;
- vLLM: per choice ``weight_versions`` (``[{version, start, end}]``) when the request set
  ``return_weight_versions`` — in a stream, only in the last chunk.

A span that produced no token (``end <= start``: the label changed twice between two
tokens) names no identity, unless it is the only one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The version label an adapter gives an engine after a failed load (SGLang, vLLM): no
#: snapshot's name, so no response and no report names the weights served before it
#: while they are unknown, until the sidecar's reload names them again.
UNKNOWN_VERSION = "hotload-weights-unknown"


def _sampled_nothing(span: Mapping[str, Any]) -> bool:
    start, end = span.get("start"), span.get("end")
    return isinstance(start, int) and isinstance(end, int) and end <= start


def ordered_unique(versions: Iterable[object]) -> list[str]:
    """Drop empties, spans that sampled no token, and consecutive repeats; keep the order."""
    items = list(versions)
    spans = [v for v in items if isinstance(v, Mapping)]
    result: list[str] = []
    for version in items:
        if isinstance(version, Mapping):
            if len(spans) > 1 and _sampled_nothing(version):
                continue
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
    """Versions named at the top level, in ``metadata`` (SGLang ``/v1``), in ``meta_info``
    (SGLang ``/generate``), or in a choice (vLLM) or its ``meta_info``."""
    found: list[object] = []
    for node in (payload, payload.get("metadata"), payload.get("meta_info")):
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
