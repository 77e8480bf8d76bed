"""Every response and streamed chunk names the policy that produced it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hotload.engines import reference_identities
from hotload.sidecar.policy_label import PolicyLabeler, SseRelabeler, policy_model


def _labeler(fallback: str | None = "fallback-1") -> PolicyLabeler:
    return PolicyLabeler("demo", reference_identities, lambda: fallback)


def _chunk(identity: str | None, text: str) -> bytes:
    payload: dict[str, Any] = {
        "object": "chat.completion.chunk",
        "model": "demo",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    if identity:
        payload["hotload_identity"] = identity
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _models(stream: bytes) -> list[str]:
    models = []
    for event in stream.split(b"\n\n"):
        if event.startswith(b"data: {"):
            models.append(json.loads(event[6:])["model"])
    return models


def test_model_names_served_name_at_identity() -> None:
    assert policy_model("demo", "step-7") == "demo@step-7"


def test_json_response_is_relabelled_with_the_engines_identity() -> None:
    labeler = _labeler()
    body = json.dumps({"model": "demo", "choices": [], "hotload_identity": "step-2"}).encode()
    assert json.loads(labeler.label_json(body))["model"] == "demo@step-2"
    assert labeler.seen == ["step-2"]


def test_a_response_spanning_a_swap_names_the_newest_and_remembers_both() -> None:
    labeler = _labeler()
    payload: Mapping[str, Any] = {"model": "demo", "choices": [], "hotload_identities": ["a", "b"]}
    assert labeler.label(dict(payload))["model"] == "demo@b"
    assert labeler.seen == ["a", "b"]


def test_without_an_engine_identity_the_agents_current_one_is_used() -> None:
    labeler = _labeler("served-9")
    out = labeler.label({"model": "demo", "choices": []})
    assert out["model"] == "demo@served-9"


def test_non_completion_objects_are_not_given_a_model() -> None:
    assert "model" not in _labeler().label({"data": [{"id": "demo"}], "object": "list"})


def test_done_marker_and_comments_pass_unchanged() -> None:
    relabeler = SseRelabeler(_labeler())
    out = relabeler.feed(b": keep-alive\n\ndata: [DONE]\n\n")
    assert out == b": keep-alive\n\ndata: [DONE]\n\n"


@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_chunks_are_relabelled_in_order_whatever_the_network_splits(cuts: list[int]) -> None:
    stream = b"".join(
        [_chunk("old", "a"), _chunk("old", "b"), _chunk("new", "c"), b"data: [DONE]\n\n"]
    )
    relabeler = SseRelabeler(_labeler())
    out = b""
    start = 0
    for cut in sorted(c % (len(stream) + 1) for c in cuts):
        out += relabeler.feed(stream[start:cut])
        start = cut
    out += relabeler.feed(stream[start:]) + relabeler.flush()
    assert _models(out) == ["demo@old", "demo@old", "demo@new"]
    assert relabeler.labeler.seen == ["old", "new"]
    assert out.endswith(b"data: [DONE]\n\n")


def test_crlf_event_boundaries_are_understood() -> None:
    relabeler = SseRelabeler(_labeler())
    out = relabeler.feed(_chunk("x", "a").replace(b"\n", b"\r\n"))
    assert _models(out) == ["demo@x"]
