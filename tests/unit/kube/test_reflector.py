"""The shared reflector's handling of one watch event (pure; the loop runs against real
apiservers in the operator, sidecar and runtime integration tests).

Would catch: a bookmark delivered as a change, an event that does not move the version,
a 410 in the stream taken for an ordinary error (it must list again at once).
"""

from __future__ import annotations

import pytest

from hotload.errors import KubeError, KubeExpired
from hotload.kube.reflector import Reflector


def test_the_pod_watch_turns_an_expired_version_into_a_fresh_list() -> None:
    seen: list[tuple[str, str]] = []
    watch = Reflector(
        lambda: None,  # type: ignore[arg-type,return-value]
        "/api/v1/namespaces/ns/pods", lambda items, version: None,
        lambda kind, pod: seen.append((kind, pod["metadata"]["name"])),
    )  # fmt: skip
    pod = {"metadata": {"name": "demo-0", "resourceVersion": "7"}}
    assert watch.handle({"type": "MODIFIED", "object": pod}, "5") == "7"
    assert watch.handle({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
                        "7") == "9"  # fmt: skip
    assert seen == [("MODIFIED", "demo-0")]
    with pytest.raises(KubeExpired):
        watch.handle({"type": "ERROR", "object": {"code": 410, "message": "too old"}}, "9")
    with pytest.raises(KubeError) as raised:
        watch.handle({"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "9")
    assert not isinstance(raised.value, KubeExpired)


def test_a_watch_without_a_list_starts_from_now_and_keeps_no_made_up_version() -> None:
    """The sidecar's own Pod (no list: RBAC grants watch only): the first watch carries no
    resourceVersion, and an event without one must not become the version "None"."""
    seen: list[str] = []
    watch = Reflector(
        lambda: None,  # type: ignore[arg-type,return-value]
        "/api/v1/namespaces/ns/pods", None, lambda kind, pod: seen.append(kind),
        params=[("fieldSelector", "metadata.name=demo-0")], list_first=False,
    )  # fmt: skip
    assert watch.handle({"type": "BOOKMARK", "object": {"metadata": {}}}, None) is None
    pod = {"metadata": {"name": "demo-0", "resourceVersion": "7"}}
    assert watch.handle({"type": "ADDED", "object": pod}, None) == "7"
    assert watch.handle({"type": "DELETED", "object": pod}, "7") == "7"
    assert seen == ["ADDED", "DELETED"]
