"""HTTP pieces both fake engines share: request checks, OpenAI shapes, SSE, test controls.

Every request to a route of the released engine is checked against the extracted route
table first (:class:`~hotload.testing.contract.EngineContract`), and refused with
422 the way FastAPI refuses a body its model rejects, so a client that drifts from the
released API fails against the fake as it would against the real server. Answers are
built from the released models' field lists (``contract.example``), never by hand.

``/hotload_fake/*`` are the fakes' own routes (no released engine has them): the state a
test asserts on, and a fault to inject into the next load.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from hotload.testing.contract import ContractViolation, EngineContract
from hotload.testing.state import Admission, FakeEngineState, Generation

DEFAULT_MAX_TOKENS = 16


async def checked_body(request: Request, contract: EngineContract) -> Any:
    """The JSON body, after the released route's checks (``ContractViolation`` if refused)."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except ValueError as err:
        raise ContractViolation(f"the body is not JSON: {err}") from err
    query: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        query.setdefault(key, []).append(value)
    contract.check_request(
        request.method,
        request.url.path,
        query,
        body,
        content_type=request.headers.get("content-type"),
    )
    return body


def refuse(err: ContractViolation) -> Response:
    """FastAPI's answer to a request its models refuse."""
    return JSONResponse({"detail": [{"msg": str(err), "type": "value_error"}]}, status_code=422)


class _ChecksBodies(Protocol):
    async def body_of(self, request: Request) -> Any: ...


RouteWithBody = Callable[[Request, Any], Awaitable[Response]]


def with_checked_body(handler: RouteWithBody) -> Callable[[Request], Awaitable[Response]]:
    """A route whose body is first checked against the released route (``app.state.fake``'s
    ``body_of``): the handler gets it, or the request gets the released server's 422."""

    async def route(request: Request) -> Response:
        fake: _ChecksBodies = request.app.state.fake
        try:
            body = await fake.body_of(request)
        except ContractViolation as err:
            return refuse(err)
        return await handler(request, body)

    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


def prompt_of(path: str, body: dict[str, Any]) -> str:
    if path.endswith("/chat/completions"):
        messages = body.get("messages") or []
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def max_tokens_of(body: dict[str, Any]) -> int:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_TOKENS


class OpenAIShapes:
    """Completion and chat answers and chunks, from the released models' fields."""

    def __init__(self, contract: EngineContract) -> None:
        self.contract = contract

    def choice(self, chat: bool, stream: bool, text: str, **extra: Any) -> dict[str, Any]:
        content: dict[str, Any]
        if chat and stream:
            model = "ChatCompletionResponseStreamChoice"
            content = {"delta": {"role": "assistant", "content": text}}
        elif chat:
            model = "ChatCompletionResponseChoice"
            content = {"message": {"role": "assistant", "content": text}}
        else:
            model = "CompletionResponseStreamChoice" if stream else "CompletionResponseChoice"
            content = {"text": text}
        return self.contract.example(model, index=0, **content, **extra)

    def response(
        self,
        chat: bool,
        stream: bool,
        model: str,
        request_id: str,
        choices: list[Any],
        **extra: Any,
    ) -> dict[str, Any]:
        name = ("ChatCompletion" if chat else "Completion") + (
            "StreamResponse" if stream else "Response"
        )
        return self.contract.example(
            name, id=request_id, model=model, created=int(time.time()), choices=choices, **extra
        )

    def usage(self, generation: Generation) -> dict[str, Any]:
        prompt_tokens = max(1, len(generation.prompt))
        usage = self.contract.example(
            "UsageInfo",
            prompt_tokens=prompt_tokens,
            completion_tokens=generation.tokens,
            total_tokens=prompt_tokens + generation.tokens,
        )
        field = self.contract.models["UsageInfo"]["fields"].get("prompt_tokens_details")
        words = re.findall(r"\w+", field["type"]) if field else []
        details_model = next((w for w in words if w in self.contract.models), None)
        if details_model is not None:
            usage["prompt_tokens_details"] = self.contract.example(
                details_model, cached_tokens=generation.cached_tokens
            )
        return usage


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def stream_generation(
    state: FakeEngineState,
    prompt: str,
    max_tokens: int,
    chunk: Callable[[Generation, str, bool], dict[str, Any]],
    *,
    admission: Admission | None = None,
) -> AsyncIterator[bytes]:
    """SSE of one generation: a chunk per token, a last chunk with the finish reason (an
    error event when ``admission`` refuses it once the stream began)."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def on_token(generation: Generation, token: str) -> None:
        await queue.put(sse(chunk(generation, token, False)))

    async def run() -> None:
        try:
            generation = await state.generate(prompt, max_tokens, on_token, admission=admission)
            await queue.put(sse(chunk(generation, "", True)))
            await queue.put(b"data: [DONE]\n\n")
        except ValueError as err:
            await queue.put(sse({"error": {"message": str(err), "code": 400}}))
            await queue.put(b"data: [DONE]\n\n")
        finally:
            await queue.put(None)

    task = asyncio.create_task(run())
    try:
        while (item := await queue.get()) is not None:
            yield item
        await task
    finally:
        if not task.done():
            task.cancel()


def add_test_controls(app: FastAPI, state: FakeEngineState) -> None:
    """``GET /hotload_fake/state``; ``POST /hotload_fake/fail_next_load {after_tensors}``."""

    @app.get("/hotload_fake/state")
    async def fake_state() -> dict[str, Any]:
        return state.describe()

    @app.post("/hotload_fake/fail_next_load")
    async def fail_next_load(request: Request) -> dict[str, Any]:
        body = await request.json()
        after = int(body.get("after_tensors", 1))
        state.fail_next_load = after
        return {"armed": True, "after_tensors": after}
