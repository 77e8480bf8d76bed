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


# --- engines whose label may outlive their weights (SGLang, vLLM: defect 7) -------------


class Agent:
    """The agent's confirmed identity, as the front reads it (None: nothing verified)."""

    def __init__(self, serving: str | None) -> None:
        self.serving = serving

    def __call__(self) -> str | None:
        return self.serving


def _untrusted(agent: Agent) -> PolicyLabeler:
    return PolicyLabeler("demo", reference_identities, agent, trust_engine=False)


def test_after_a_failed_load_the_engines_old_label_is_not_believed() -> None:
    """SGLang keeps naming the old version over weights a failed load left unknown: with
    nothing verified the front names no policy, whatever the engine says."""
    labeler = _untrusted(Agent(None))
    out = labeler.label({"model": "x", "choices": [], "hotload_identity": "step-1"})
    assert out["model"] == "demo" and labeler.seen == []


def test_a_label_the_agent_never_confirmed_gives_way_to_the_agents_own() -> None:
    labeler = _untrusted(Agent("step-2"))
    out = labeler.label({"model": "x", "choices": [], "hotload_identity": "step-1"})
    assert out["model"] == "demo@step-2" and labeler.seen == ["step-2"]


def test_an_async_swap_confirmed_during_the_request_keeps_both_spans() -> None:
    agent = Agent("old")
    labeler = _untrusted(agent)  # the request began under "old"
    agent.serving = "new"  # the agent confirmed the swap while it ran
    out = labeler.label({"model": "x", "choices": [], "hotload_identities": ["old", "new"]})
    assert out["model"] == "demo@new" and labeler.seen == ["old", "new"]


def test_the_reference_engines_own_label_stands_before_the_agent_confirms() -> None:
    """It swaps between tokens and names exactly its weights: its word comes first."""
    labeler = PolicyLabeler("demo", reference_identities, Agent("old"))
    out = labeler.label({"model": "x", "choices": [], "hotload_identity": "new"})
    assert out["model"] == "demo@new"
