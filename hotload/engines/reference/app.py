"""The reference engine's HTTP surface: OpenAI-compatible generation plus an admin API.

- ``GET /health`` — 200 once the model is loaded (the server listens only after that).
- ``GET /v1/models``; ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE with
  ``stream: true``). Every response and every chunk carries ``hotload_identity`` (the
  weights that produced its tokens) and ``hotload_identities`` (all of them, in order);
  ``model`` is the served name (the sidecar's front rewrites it to ``name@identity``).
  The session header ``x-multi-turn-session-id`` keys the prompt cache.
- ``POST /admin/load {path, identity, kind}`` — 200, 422 (refused: old weights serve on),
  409 (another load runs). ``POST /admin/apply_delta {path, identity}`` — patch the served
  weights with the verified delta at ``path`` in place: 200, 422 (refused: old weights
  serve on; ``"fallback": "load"`` when the delta cannot be patched in place and the
  rebuilt directory should be loaded instead), 409 (another load runs). Both take an
  optional ``cache_policy``, applied between the same two tokens as the swap.
  ``POST /admin/stage {path, identity, kind}`` — read, check and build a load beside
  serving and hold it (a coordinated switch); ``POST /admin/switch {identity, at}`` — swap
  the staged load in between two tokens at the wall-clock instant ``at`` (Unix seconds)
  and answer with the instant it took effect (422: nothing staged for it). Every swap's
  instant is in ``swap_log`` of ``/admin/identity``: the engine's own word on when.
  ``POST /admin/pause {mode}``, ``POST /admin/resume``, ``POST /admin/reset_cache
  {policy}``, ``GET /admin/identity``, ``GET /admin/cache``.
- Debugging for tests: ``POST /admin/logits {prompt_token_ids}`` (sha256 of the float32
  logits, computed single-threaded, and the last position's values),
  ``GET /admin/weights_digest`` (sha256 of the served weights in the storage dtype) and
  ``POST /admin/swap_delay {seconds}`` (a slow engine: the time between reading a load's
  files and swapping them in, for fault-injection tests) and ``POST /admin/token_delay
  {seconds}`` (a slow generation: a pause before every token, so a test's long stream
  outlasts a drain limit whatever the machine's speed).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from hotload.api.pod import SESSION_HEADER
from hotload.engines.reference import tokenizer as tok
from hotload.engines.reference.runtime import GenerationRequest, GenerationStats, ReferenceRuntime
from hotload.engines.reference.schemas import (
    ChatRequest,
    CompletionRequest,
    DeltaRequest,
    LoadRequest,
    LogitsRequest,
    PauseRequest,
    ResetCacheRequest,
    StageRequest,
    SwapDelayRequest,
    SwitchRequest,
)
from hotload.errors import ConfigError, DeltaNotApplicable, EngineBusy, EngineRejected
from hotload.mounts import host_path

DEFAULT_MAX_TOKENS = 16


def _usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass(frozen=True)
class EngineState:
    """What every route reads (``app.state.engine``): the runtime and how it is served."""

    runtime: ReferenceRuntime
    served_name: str
    root: Path | None
    """The pod's ``HOTLOAD_ROOT`` under the local runtime (paths are mapped through it)."""


def _state(request: Request) -> EngineState:
    state: EngineState = request.app.state.engine
    return state


router = APIRouter()


def _answer(
    status: int, *, reason: str | None = None, fallback: str | None = None
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """An exception handler answering ``status`` with the error's reason word (or
    ``reason``), and ``fallback`` when the caller should load the directory instead."""

    async def handle(_: Request, err: Exception) -> JSONResponse:
        body = {"detail": str(err), "reason": reason or getattr(err, "reason", "Error")}
        if fallback is not None:
            body["fallback"] = fallback
        return JSONResponse(body, status_code=status)

    return handle


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    return {"status": "ok", "identity": _state(request).runtime.identity}


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    served_name = _state(request).served_name
    return {
        "object": "list",
        "data": [{"id": served_name, "object": "model", "owned_by": "hotload"}],
    }


def _choice(
    kind: str, text: str, finish: str | None, token_ids: list[int], *, chunk: bool
) -> dict[str, Any]:
    if kind == "chat":
        content: dict[str, Any] = {"role": "assistant", "content": text}
        return {
            "index": 0,
            ("delta" if chunk else "message"): content,
            "finish_reason": finish,
            "token_ids": token_ids,
        }
    return {"index": 0, "text": text, "finish_reason": finish, "token_ids": token_ids}


async def _generate(
    state: EngineState,
    kind: str,
    prompt: list[int],
    body: CompletionRequest | ChatRequest,
    session: str | None,
    max_tokens: int,
) -> Any:
    runtime, served_name = state.runtime, state.served_name
    request = GenerationRequest(
        prompt=tuple(prompt),
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        session=session,
    )
    if len(prompt) >= runtime.max_context:
        return JSONResponse({"detail": "the prompt is longer than the context"}, status_code=400)
    if any(not 0 <= token < int(runtime.config.vocab_size) for token in prompt):
        return JSONResponse(
            {"detail": "a prompt token id is outside the vocabulary"}, status_code=400
        )
    stats = GenerationStats()
    completion_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    obj = "chat.completion" if kind == "chat" else "text_completion"

    if not body.stream:
        texts: list[str] = []
        ids: list[int] = []
        finish: str | None = None
        async with aclosing(runtime.generate(request, stats)) as tokens:
            async for token in tokens:
                texts.append(token.text)
                ids.append(token.token_id)
                finish = token.finish_reason
        return {
            "id": completion_id,
            "object": obj,
            "created": created,
            "model": served_name,
            "choices": [_choice(kind, "".join(texts), finish, ids, chunk=False)],
            "usage": _usage(stats),
            "hotload_identity": stats.identities[-1] if stats.identities else runtime.identity,
            "hotload_identities": list(stats.identities),
        }

    async def events() -> AsyncIterator[bytes]:
        chunk_obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        # aclosing: a client that goes away ends the generation at once (and its
        # slot, which a WAIT pause counts), not whenever the generator is collected
        async with aclosing(runtime.generate(request, stats)) as tokens:
            async for token in tokens:
                choice = _choice(
                    kind, token.text, token.finish_reason, [token.token_id], chunk=True
                )
                payload: dict[str, Any] = {
                    "id": completion_id,
                    "object": chunk_obj,
                    "created": created,
                    "model": served_name,
                    "choices": [choice],
                    "hotload_identity": token.identity,
                    "hotload_identities": [token.identity],
                }
                if token.finish_reason:
                    payload["usage"] = _usage(stats)
                yield _sse(payload)
        yield _sse("[DONE]")

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Any:
    prompt = tok.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    return await _generate(
        _state(request),
        "text",
        prompt,
        body,
        request.headers.get(SESSION_HEADER),
        body.max_tokens or DEFAULT_MAX_TOKENS,
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat(body: ChatRequest, request: Request) -> Any:
    rendered = tok.render_chat([message.model_dump() for message in body.messages])
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    session = request.headers.get(SESSION_HEADER)
    return await _generate(_state(request), "chat", tok.encode(rendered), body, session, max_tokens)


@router.post("/admin/load")
async def load(body: LoadRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    report = await state.runtime.load(
        host_path(body.path, state.root), body.identity, body.kind, cache_policy=body.cache_policy
    )
    return {
        "identity": report.identity,
        "kind": report.kind.value,
        "read_seconds": report.read_seconds,
        "swap_seconds": report.swap_seconds,
    }


@router.post("/admin/stage")
async def stage(body: StageRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    seconds = await state.runtime.stage(host_path(body.path, state.root), body.identity, body.kind)
    return {"identity": body.identity, "staged_seconds": seconds}


@router.post("/admin/switch")
async def switch(body: SwitchRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    await state.runtime.switch(body.identity, at=body.at, cache_policy=body.cache_policy)
    switches = (r for r in reversed(state.runtime.swap_log) if r.how == "switch")
    record = next(r for r in switches if r.identity == body.identity)
    return {"identity": record.identity, "at": record.at, "requested_at": record.requested_at}


@router.post("/admin/apply_delta")
async def apply_delta(body: DeltaRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    report = await state.runtime.apply_delta(
        host_path(body.path, state.root), body.identity, cache_policy=body.cache_policy
    )
    return {
        "identity": report.identity,
        "kind": report.kind.value,
        "patch_seconds": report.read_seconds,
        "swap_seconds": report.swap_seconds,
    }


@router.post("/admin/pause")
async def pause(body: PauseRequest, request: Request) -> dict[str, Any]:
    await _state(request).runtime.pause(body.mode)
    return {"paused": True, "mode": body.mode.value}


@router.post("/admin/resume")
async def resume(request: Request) -> dict[str, Any]:
    await _state(request).runtime.resume()
    return {"paused": False}


@router.post("/admin/reset_cache")
async def reset_cache(body: ResetCacheRequest, request: Request) -> dict[str, Any]:
    dropped = _state(request).runtime.reset_cache(body.policy)
    return {"policy": body.policy.value, "dropped": dropped}


@router.get("/admin/identity")
async def identity(request: Request, digest: bool = False) -> dict[str, Any]:
    runtime = _state(request).runtime
    if digest:
        return await runtime.describe_with_digest()
    return runtime.describe()


@router.get("/admin/cache")
async def cache(request: Request) -> dict[str, Any]:
    return {"entries": _state(request).runtime.cache.describe()}


@router.post("/admin/logits", response_model=None)
async def logits(body: LogitsRequest, request: Request) -> dict[str, Any] | JSONResponse:
    runtime = _state(request).runtime
    if any(token >= int(runtime.config.vocab_size) for token in body.prompt_token_ids):
        return JSONResponse({"detail": "a token id is outside the vocabulary"}, status_code=400)
    digest, served = await runtime.logits(body.prompt_token_ids)
    return {
        "identity": served,
        "sha256": digest.sha256,
        "shape": list(digest.shape),
        "last": digest.last,
    }


@router.post("/admin/swap_delay")
async def swap_delay(body: SwapDelayRequest, request: Request) -> dict[str, Any]:
    runtime = _state(request).runtime
    runtime.swap_delay_s = body.seconds
    return {"swap_delay_s": runtime.swap_delay_s}


@router.post("/admin/token_delay")
async def token_delay(body: SwapDelayRequest, request: Request) -> dict[str, Any]:
    runtime = _state(request).runtime
    runtime.token_delay_s = body.seconds
    return {"token_delay_s": runtime.token_delay_s}


@router.get("/admin/weights_digest")
async def weights_digest(request: Request) -> dict[str, Any]:
    digest, served = await _state(request).runtime.weights_digest()
    return {"identity": served, "sha256": digest}


def create_app(runtime: ReferenceRuntime, *, served_name: str, root: Path | None = None) -> FastAPI:
    """The FastAPI app over ``runtime``: the module's routes over one :class:`EngineState`.

    ``root`` is the pod's ``HOTLOAD_ROOT`` under the local runtime: the sidecar hands over
    paths under the staging mount, and they are mapped to this host through
    :func:`hotload.mounts.host_path` (the one place mount paths are mapped).
    """
    app = FastAPI(title="hotload reference engine", docs_url=None, redoc_url=None)
    app.state.engine = EngineState(runtime, served_name, root)
    app.add_exception_handler(EngineRejected, _answer(422))
    app.add_exception_handler(DeltaNotApplicable, _answer(422, fallback="load"))
    app.add_exception_handler(ConfigError, _answer(422, reason=EngineRejected.reason))
    app.add_exception_handler(EngineBusy, _answer(409))
    app.include_router(router)
    return app
