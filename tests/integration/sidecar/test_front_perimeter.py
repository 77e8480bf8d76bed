"""The front is the pod's one serving port: it forwards an allow-list of OpenAI routes and
nothing else of the engine, and it bounds what a request may cost it.

A real reference engine process and a real front (uvicorn) on loopback; requests are raw
HTTP/1.1, so the path reaches the front exactly as an attacker writes it. Issue 22 found
``/v1/../admin/*`` proxied to the engine (identity, cache listing with session ids,
``POST /admin/resume``), a 128 MiB body accepted and 100k-deep JSON answered 500: each
test here failed on that code (d2baf31) and names what it would catch.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.integration.engines.conftest import EngineProcess
from tests.integration.sidecar.front_server import MAX_DEPTH, MAX_REQUEST_BYTES, FrontServer

#: Paths that reach the engine's admin plane once normalised or decoded.
TRAVERSALS = [
    "/v1/../admin/identity",
    "/v1/../admin/cache",
    "/v1/%2e%2e/admin/identity",
    "/v1/%2E%2E/admin/identity",
    "/v1/.%2e/admin/identity",
    "/v1/%2e./admin/cache",
    "/v1/..%2Fadmin/identity",
    "/v1%2F..%2Fadmin%2Fidentity",
    "/v1/..%5Cadmin/identity",
    "/v1/..\\admin/identity",
    "/v1/./../admin/identity",
    "/v1//../admin/identity",
    "/v1/completions/../../admin/identity",
    "/v1/completions/%2e%2e/%2e%2e/admin/identity",
    "/v1/%252e%252e/admin/identity",
    "/./v1/../admin/identity",
    "http://engine/admin/identity",
    "/admin/identity",
    "/health",
]
#: Engine routes under ``/v1`` that are not generation: vLLM's adapter loading lives there.
NOT_ALLOWED_UNDER_V1 = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/admin"]


def _engine_state(engine: EngineProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{engine.base_url}/admin/identity", timeout=10) as answer:
        state: dict[str, Any] = json.loads(answer.read())
    return state


def _engine_post(engine: EngineProcess, path: str, body: object) -> None:
    request = urllib.request.Request(
        f"{engine.base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def _nested(depth: int) -> bytes:
    """A completion request whose ``metadata`` nests objects to ``depth`` in all."""
    return (
        b'{"prompt":"hi","max_tokens":1,"metadata":'
        + b'{"a":' * (depth - 1)
        + b"1"
        + (b"}" * (depth - 1))
        + b"}"
    )


@pytest.mark.parametrize("target", TRAVERSALS + NOT_ALLOWED_UNDER_V1)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_front_never_forwards_a_path_outside_its_allow_list(
    front: FrontServer, front_engine: EngineProcess, target: str, method: str
) -> None:
    """Catches a front that forwards a prefix (`/v1/{path}`) and lets the client's dots and
    escapes pick the engine route: today's code answered the engine's identity (200)."""
    answer = front.request(method, target, b"{}" if method == "POST" else b"")

    assert answer.status in (400, 404, 405), (target, answer.status, answer.body[:200])
    assert b"instance_id" not in answer.body and b"entries" not in answer.body


def test_a_foreign_resume_through_the_front_never_reaches_the_engine(
    front: FrontServer, front_engine: EngineProcess
) -> None:
    """`POST /v1/../admin/resume` resumed an engine paused by its sidecar (200) in issue 22."""
    _engine_post(front_engine, "/admin/pause", {"mode": "in_place"})
    try:
        for target in ("/v1/../admin/resume", "/v1/%2e%2e/admin/resume"):
            answer = front.request("POST", target, b"{}")
            assert answer.status == 400, answer.body
        assert _engine_state(front_engine)["paused"] is True
    finally:
        _engine_post(front_engine, "/admin/resume", {})


def test_allowed_routes_still_reach_the_engine_with_the_policy_named(
    front: FrontServer, front_engine: EngineProcess
) -> None:
    """The allow-list is not a wall: models and a completion pass, labelled."""
    identity = front_engine.started_as["identity"]
    models = front.request("GET", "/v1/models")
    completion = front.request(
        "POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    )

    assert models.status == 200 and models.json()["data"][0]["id"] == "reference"
    assert completion.status == 200, completion.body
    assert completion.json()["model"] == f"reference@{identity}"
    assert completion.headers["x-hotload-policy"] == identity


def test_a_body_past_the_cap_is_refused_before_it_is_read(front: FrontServer) -> None:
    """Issue 22 sent 128 MiB and the front took it: a declared length past the cap is
    refused at once (only the headers and a few bytes sent), an undeclared one once the
    bytes read pass it."""
    declared = front.request(
        "POST", "/v1/completions", b"{", declared_length=128 * 1024 * 1024, timeout=10.0
    )
    sent = front.request("POST", "/v1/chat/completions", b" " * (MAX_REQUEST_BYTES + 1))

    assert declared.status == 413, declared.body
    assert sent.status == 413, sent.body
    assert declared.json()["error"]["type"] == "request_too_large"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_json_nested_past_the_cap_is_refused_not_a_500(front: FrontServer, depth: int) -> None:
    """100k-deep JSON answered 500 (RecursionError in the parser) in issue 22."""
    body = b"[" * depth + b"]" * depth if depth > 1000 else _nested(depth)
    if len(body) > MAX_REQUEST_BYTES:
        body = b"[" * (MAX_REQUEST_BYTES // 2 - 1) + b"]" * (MAX_REQUEST_BYTES // 2 - 1)

    answer = front.request("POST", "/v1/completions", body)

    assert answer.status == 400, answer.body[:200]


def test_json_nested_to_the_cap_passes(front: FrontServer) -> None:
    answer = front.request("POST", "/v1/completions", _nested(MAX_DEPTH))

    assert answer.status == 200, answer.body[:300]


@pytest.mark.parametrize(
    "body", [b"[1, 2]", b'"text"', b"null", b"{", b"\xff\xfe", b'{"prompt": NaN}', b""]
)
def test_a_body_that_is_not_one_json_object_is_refused(front: FrontServer, body: bytes) -> None:
    answer = front.request("POST", "/v1/completions", body)

    assert answer.status == 400, answer.body[:200]
    assert answer.json()["error"]["type"] == "invalid_request_error"
