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
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
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
    SwapDelayRequest,
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


def create_app(runtime: ReferenceRuntime, *, served_name: str, root: Path | None = None) -> FastAPI:
    """The FastAPI app over ``runtime``.

    ``root`` is the pod's ``HOTLOAD_ROOT`` under the local runtime: the sidecar hands over
    paths under the staging mount, and they are mapped to this host through
    :func:`hotload.mounts.host_path` (the one place mount paths are mapped).
    """
    app = FastAPI(title="hotload reference engine", docs_url=None, redoc_url=None)

    @app.exception_handler(EngineRejected)
    async def rejected(_: Request, err: EngineRejected) -> JSONResponse:
        return JSONResponse({"detail": str(err), "reason": err.reason}, status_code=422)

    @app.exception_handler(DeltaNotApplicable)
    async def not_in_place(_: Request, err: DeltaNotApplicable) -> JSONResponse:
        body = {"detail": str(err), "reason": err.reason, "fallback": "load"}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(ConfigError)
    async def bad_path(_: Request, err: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(err), "reason": EngineRejected.reason}, status_code=422)

    @app.exception_handler(EngineBusy)
    async def busy(_: Request, err: EngineBusy) -> JSONResponse:
        return JSONResponse({"detail": str(err), "reason": err.reason}, status_code=409)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "identity": runtime.identity}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": served_name, "object": "model", "owned_by": "hotload"}],
        }

    async def run(
        kind: str,
        prompt: list[int],
        body: CompletionRequest | ChatRequest,
        session: str | None,
        max_tokens: int,
    ) -> Any:
        request = GenerationRequest(
            prompt=tuple(prompt),
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            session=session,
        )
        if len(prompt) >= runtime.max_context:
            return JSONResponse(
                {"detail": "the prompt is longer than the context"}, status_code=400
            )
        if any(not 0 <= token < int(runtime.config.vocab_size) for token in prompt):
            return JSONResponse(
                {"detail": "a prompt token id is outside the vocabulary"}, status_code=400
            )
        stats = GenerationStats()
        completion_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        obj = "chat.completion" if kind == "chat" else "text_completion"

        def choice(
            text: str, finish: str | None, token_ids: list[int], *, chunk: bool
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
                "choices": [choice("".join(texts), finish, ids, chunk=False)],
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
                    payload: dict[str, Any] = {
                        "id": completion_id,
                        "object": chunk_obj,
                        "created": created,
                        "model": served_name,
                        "choices": [
                            choice(token.text, token.finish_reason, [token.token_id], chunk=True)
                        ],
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

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        prompt = tok.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        return await run(
            "text",
            prompt,
            body,
            request.headers.get(SESSION_HEADER),
            body.max_tokens or DEFAULT_MAX_TOKENS,
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> Any:
        rendered = tok.render_chat([message.model_dump() for message in body.messages])
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        return await run(
            "chat", tok.encode(rendered), body, request.headers.get(SESSION_HEADER), max_tokens
        )

    @app.post("/admin/load")
    async def load(body: LoadRequest) -> dict[str, Any]:
        report = await runtime.load(
            host_path(body.path, root), body.identity, body.kind, cache_policy=body.cache_policy
        )
        return {
            "identity": report.identity,
            "kind": report.kind.value,
            "read_seconds": report.read_seconds,
            "swap_seconds": report.swap_seconds,
        }

    @app.post("/admin/apply_delta")
    async def apply_delta(body: DeltaRequest) -> dict[str, Any]:
        report = await runtime.apply_delta(
            host_path(body.path, root), body.identity, cache_policy=body.cache_policy
        )
        return {
            "identity": report.identity,
            "kind": report.kind.value,
            "patch_seconds": report.read_seconds,
            "swap_seconds": report.swap_seconds,
        }

    @app.post("/admin/pause")
    async def pause(body: PauseRequest) -> dict[str, Any]:
        await runtime.pause(body.mode)
        return {"paused": True, "mode": body.mode.value}

    @app.post("/admin/resume")
    async def resume() -> dict[str, Any]:
        await runtime.resume()
        return {"paused": False}

    @app.post("/admin/reset_cache")
    async def reset_cache(body: ResetCacheRequest) -> dict[str, Any]:
        dropped = runtime.reset_cache(body.policy)
        return {"policy": body.policy.value, "dropped": dropped}

    @app.get("/admin/identity")
    async def identity(digest: bool = False) -> dict[str, Any]:
        if digest:
            return await runtime.describe_with_digest()
        return runtime.describe()

    @app.get("/admin/cache")
    async def cache() -> dict[str, Any]:
        return {"entries": runtime.cache.describe()}

    @app.post("/admin/logits")
    async def logits(body: LogitsRequest) -> dict[str, Any]:
        if any(token >= int(runtime.config.vocab_size) for token in body.prompt_token_ids):
            return JSONResponse(  # type: ignore[return-value]
                {"detail": "a token id is outside the vocabulary"}, status_code=400
            )
        digest, served = await runtime.logits(body.prompt_token_ids)
        return {
            "identity": served,
            "sha256": digest.sha256,
            "shape": list(digest.shape),
            "last": digest.last,
        }

    @app.post("/admin/swap_delay")
    async def swap_delay(body: SwapDelayRequest) -> dict[str, Any]:
        runtime.swap_delay_s = body.seconds
        return {"swap_delay_s": runtime.swap_delay_s}

    @app.post("/admin/token_delay")
    async def token_delay(body: SwapDelayRequest) -> dict[str, Any]:
        runtime.token_delay_s = body.seconds
        return {"token_delay_s": runtime.token_delay_s}

    @app.get("/admin/weights_digest")
    async def weights_digest() -> dict[str, Any]:
        digest, served = await runtime.weights_digest()
        return {"identity": served, "sha256": digest}

    return app
