"""A server that answers like SGLang 0.5.23's ``http_server`` for what hotload uses.

Each behaviour is the release's, read in its wheel (``sglang/srt/...`` of
``sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl``; file hashes in
``tests/fixtures/engines/sglang-0.5.23/source.json``):

- ``/update_weights_from_disk``: unpaused it takes the update writer lock, so it waits for
  in-flight generations and holds new ones; paused it applies at once
  (``managers/tokenizer_manager.py:2302-2313``). On success the version is recorded and
  ``served_model_name``/``model_path`` become the loaded path
  (``tokenizer_manager.py:2315-2320, 2365-2386``); a failed load "rolls back" by re-reading
  the *new* path, so the weights are left part new, part old under the old label
  (``model_runner_components/weight_updater.py``). With ``flush_cache`` (default true) the
  cache is flushed right after the load, under the same rule as ``/flush_cache?timeout=0``
  (below); a refused flush fails the call although the weights changed, and then neither
  the version nor the model path is updated (``managers/scheduler_components/
  weight_updater.py:120-131, 137-160``; ``tokenizer_manager.py:2315-2320``).
- ``/flush_cache?timeout=S``: with ``S <= 0`` it flushes at once when the running batch is
  empty — the waiting queue ignored *while paused* (``managers/scheduler.py:5518-5546,
  5337-5356``); with ``S > 0`` it needs the engine *fully* idle, waiting queue included
  (``scheduler_components/flush_wrapper.py:22-61`` calls ``is_fully_idle()`` without
  ``ignore_waiting``), and answers 400 at the deadline. A ``retract`` pause moves running
  requests back to the waiting queue (``scheduler.py:5841-5910``): after it, ``timeout=0``
  succeeds and any ``timeout > 0`` waits the whole timeout, then fails.
- ``/pause_generation``: ``in_place`` only sets the flag (``scheduler.py:5817-5829``),
  ``retract`` drops running requests' KV and re-queues them, ``abort`` aborts them
  (``tokenizer_manager.py:2267-2280``); new requests wait while paused
  (``tokenizer_manager.py:938-939``).
- ``/ready`` answers 503 for the whole of a pause (``entrypoints/http_server.py:714-718``,
  ``tokenizer_manager.py:732-734``: ``not is_pause and is_healthy()``); ``/ping`` answers
  200 whenever the server is up, paused or not (``http_server.py:2190-2199``,
  ``tokenizer_manager.py:728-730``); ``/health`` runs a one-token generation that a pause
  holds until ``SGLANG_HEALTH_CHECK_TIMEOUT``, then 503, unless
  ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0`` (``http_server.py:721-799``).
- LoRA adapters (:mod:`hotload.testing.sglang_lora`): an unload waits for every request
  using the adapter; ``/v1/models`` lists loaded adapters with ``parent`` = the served name
  and ``root`` = their path (``http_server.py:1993-2022``).
- Non-streamed ``/v1`` answers carry ``metadata.weight_version(s)``
  (``entrypoints/openai/serving_completions.py:645``, ``utils/weight_versions.py:90-116``;
  ``CompletionResponse.metadata``, ``protocol.py:528-535``, ``ChatCompletionResponse``
  1336-1343), stream chunks none (``CompletionStreamResponse`` 568,
  ``ChatCompletionStreamResponse`` 1388: no such field). ``/update_weight_version``
  names the version at once (``http_server.py:1527-1556``,
  ``tokenizer_control_mixin.py:1065-1079``). A ``model`` that is not the served name and
  holds a colon names an adapter (``entrypoints/openai/serving_base.py:40-60``).
- Admin routes take the admin key when one is set, ``/model_info`` and ``/v1`` the API
  key, probes (``/health*``, ``/ready*``, ``/metrics``) none (``utils/auth.py:74-150``).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from hotload.errors import ConfigError, EngineRejected
from hotload.mounts import host_path
from hotload.testing.contract import EngineContract
from hotload.testing.http import (
    OpenAIShapes,
    add_test_controls,
    checked_body,
    max_tokens_of,
    prompt_of,
    stream_generation,
    with_checked_body,
)
from hotload.testing.sglang_lora import (
    FakeLoraRegistry,
    LoraRequest,
    adapter_dir_exists,
    check_lora_args,
)
from hotload.testing.state import FakeEngineState, Generation, Pause, Rules
from hotload.testing.weights import LoadFailedMidway

_PAUSES = {"abort": Pause.ABORT, "retract": Pause.RETRACT, "in_place": Pause.IN_PLACE}


@dataclass(frozen=True)
class SGLangOptions:
    model_path: str
    served_name: str | None = None
    weight_version: str = "default"
    weights: Path | None = None
    api_key: str | None = None
    admin_api_key: str | None = None
    enable_lora: bool = False
    lora_paths: tuple[str, ...] = ()
    max_lora_rank: int | None = None
    lora_target_modules: tuple[str, ...] = ()
    health_generation: bool = True
    """``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` (default on, as released)."""
    health_timeout: float = 20.0
    """``SGLANG_HEALTH_CHECK_TIMEOUT``."""
    token_interval: float = 0.02
    root: Path | None = None
    """``HOTLOAD_ROOT``: where mount paths live on this host (the local pod runtime)."""


def auth_refusal(
    level: str, path: str, header: str | None, api_key: str | None, admin_key: str | None
) -> int | None:
    """SGLang's ``decide_request_auth``: the status refusing the request, or None."""
    if path.startswith(("/health", "/ready", "/metrics")):
        return None

    def bearer(expected: str) -> bool:
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token, expected)

    if level == "admin_force":
        if not admin_key:
            return 403
        return None if bearer(admin_key) else 401
    if level == "admin_optional":
        if admin_key:
            return None if bearer(admin_key) else 401
        if api_key:
            return None if bearer(api_key) else 401
        return None
    if api_key:
        return None if bearer(api_key) else 401
    return None


@dataclass
class FakeSGLang:
    """One fake server's state (``app.state.fake``): what every route reads."""

    options: SGLangOptions
    contract: EngineContract
    state: FakeEngineState
    shapes: OpenAIShapes
    loras: FakeLoraRegistry

    async def body_of(self, request: Request) -> Any:
        return await checked_body(request, self.contract)

    def local(self, path: str) -> Path:
        return host_path(path, self.options.root)

    def adapter_of(self, model: str, lora_path: Any) -> str | None:
        """``serving_base._parse_model_parameter`` + ``_resolve_lora_path``: a ``model``
        that is not the served name and holds a colon names an adapter (``base:adapter``)."""
        adapter = lora_path if isinstance(lora_path, str) else None
        served = self.state.served_name
        if ":" in model and model != served:
            prefix = f"{served}:"
            adapter = model[len(prefix) :] if model.startswith(prefix) else model.split(":")[1]
        return adapter or None

    def lora_refusal(self, adapter: str | None) -> str | None:
        if adapter is None:
            return None
        if not self.options.enable_lora:
            return f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled."
        return self.loras.refusal(adapter)


def _fake(request: Request) -> FakeSGLang:
    fake: FakeSGLang = request.app.state.fake
    return fake


router = APIRouter()


async def authenticate(request: Request, call_next: Any) -> Response:
    """The release's ``decide_request_auth`` on every route it declares."""
    fake = _fake(request)
    options = fake.options
    route = fake.contract.routes.get((request.method, request.url.path))
    if route is not None and (options.api_key or options.admin_api_key):
        status = auth_refusal(
            route.auth,
            request.url.path,
            request.headers.get("authorization"),
            options.api_key,
            options.admin_api_key,
        )
        if status is not None:
            error = "Unauthorized" if status == 401 else "Forbidden"
            return JSONResponse({"error": error}, status_code=status)
    response: Response = await call_next(request)
    return response


@router.get("/ready")
async def ready(request: Request) -> Response:
    # is_ready(): not paused and healthy (tokenizer_manager.py:732-734).
    return Response(status_code=503 if _fake(request).state.paused is not None else 200)


@router.get("/ping")
async def ping() -> Response:
    # is_healthy() only: a paused server is up (http_server.py:2190-2199).
    return Response(status_code=200)


async def _health_generate(fake: FakeSGLang) -> Response:
    state = fake.state
    if not fake.options.health_generation:
        return Response(status_code=200)
    # One token through the scheduler: a pause holds it, and after the timeout the
    # server answers 503 (and marks itself unhealthy), as 0.5.23 does.
    if state.paused is not None:
        await asyncio.sleep(fake.options.health_timeout)
        if state.paused is not None:
            state.counters["health_timeouts"] += 1
            return Response(status_code=503)
    return Response(status_code=200)


@router.get("/health")
async def health(request: Request) -> Response:
    return await _health_generate(_fake(request))


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    return await _health_generate(_fake(request))


@router.get("/model_info")
async def model_info(request: Request) -> Response:
    fake = _fake(request)
    state = fake.state
    payload = {
        "model_path": state.model_path,
        "served_model_name": state.served_name,
        "tokenizer_path": fake.options.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": state.version,
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
    }
    fake.contract.check_answer("GET", "/model_info", payload)
    return JSONResponse(payload)


async def _load_from_disk(fake: FakeSGLang, body: Any) -> tuple[bool, str]:
    """One ``/update_weights_from_disk``: the load, its flush, then the labels."""
    state = fake.state
    path = body["model_path"]
    try:
        await state.load(fake.local(path))
    except ConfigError as err:
        return False, f"Failed to get weights iterator: {err}."
    except LoadFailedMidway as err:
        # 0.5.23 "rolls back" by re-reading model_config.model_path, which it set
        # to the *new* path first: the same files, the same failure.
        return False, f"Failed to update weights: {err}.\nRolling back to original weights."
    except EngineRejected as err:
        return False, f"Failed to get weights iterator: {err}."
    if body.get("flush_cache", True) and not await state.flush(
        timeout=0, ignore_held=state.paused is not None
    ):
        # weight_updater.py:120-131: the weights changed; the call fails, so the
        # version and the model path stay as they were (tokenizer_manager.py).
        return False, (
            "Weights were updated, but the cache was not flushed because requests "
            "are still running or queued. Retract or finish them, then call "
            "/flush_cache."
        )
    version = body.get("weight_version")
    if version is not None:
        state.version = version
    state.model_path = path
    state.served_name = path
    return True, "Succeeded to update model weights."


@router.post("/update_weights_from_disk")
@with_checked_body
async def update_weights_from_disk(request: Request, body: Any) -> Response:
    fake = _fake(request)
    state = fake.state

    async def load() -> tuple[bool, str]:
        return await _load_from_disk(fake, body)

    if state.paused is None:
        success, message = await state.exclusive(load)
    else:
        success, message = await load()
    payload = {"success": success, "message": message, "num_paused_requests": 0}
    fake.contract.check_answer("POST", "/update_weights_from_disk", payload)
    return JSONResponse(payload, status_code=200 if success else 400)


@router.post("/update_weight_version")
@with_checked_body
async def update_weight_version(request: Request, body: Any) -> Response:
    state = _fake(request).state
    if body.get("abort_all_requests", True):
        for generation in state.running.values():
            generation.finish_reason = "abort"
    state.version = body["new_version"]
    return JSONResponse(
        {
            "success": True,
            "message": f"Weight version updated to {body['new_version']}",
            "new_version": body["new_version"],
        }
    )


@router.post("/pause_generation")
@with_checked_body
async def pause_generation(request: Request, body: Any) -> Response:
    await _fake(request).state.pause(_PAUSES[body.get("mode", "abort")])
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


@router.post("/continue_generation")
@with_checked_body
async def continue_generation(request: Request, _body: Any) -> Response:
    await _fake(request).state.resume()
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})


@router.api_route("/flush_cache", methods=["GET", "POST"])
@with_checked_body
async def flush_cache(request: Request, _body: Any) -> Response:
    state = _fake(request).state
    timeout = float(request.query_params.get("timeout", 0.0))
    if timeout <= 0:
        # scheduler.flush_cache: the waiting queue is ignored while paused.
        flushed = await state.flush(timeout=0, ignore_held=state.paused is not None)
    else:
        # flush_wrapper: fully idle, waiting queue included, paused or not.
        flushed = await state.flush(timeout=timeout, ignore_held=False)
    if flushed:
        return Response("Cache flushed.\n", status_code=200)
    message = "Timed out waiting for idle state." if timeout > 0 else "Flush cache failed.\n"
    return Response(message, status_code=400)


@router.api_route("/weights_checker", methods=["GET", "POST"])
@with_checked_body
async def weights_checker(request: Request, body: Any) -> Response:
    fake = _fake(request)
    state = fake.state
    action = (body or {}).get("action", "checksum")
    if action != "checksum":
        payload = {"success": True, "message": f"{action} done"}
        return JSONResponse(payload)
    checksums = state.store.checksums()
    info = fake.contract.example(
        "ChecksumInfo",
        checksums=checksums,
        per_gpu_checksum=state.digest,
        parallelism_info=[],
    )
    per_engine = hashlib.sha256(state.digest.encode()).hexdigest()
    payload = {
        "success": True,
        "message": "checksum computed",
        "ranks": [info],
        "per_engine_checksum": per_engine,
    }
    fake.contract.check_answer("POST", "/weights_checker", payload)
    return JSONResponse(payload)


@router.post("/load_lora_adapter")
@with_checked_body
async def load_lora_adapter(request: Request, body: Any) -> Response:
    fake = _fake(request)
    contract, loras = fake.contract, fake.loras
    error: str | None = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
    if fake.options.enable_lora:
        error = await loras.load(body["lora_name"], body["lora_path"])
    if error is not None:
        result = contract.example("LoRAUpdateOutput", success=False, error_message=error)
        return JSONResponse(result, status_code=400)
    result = contract.example(
        "LoRAUpdateOutput", success=True, loaded_adapters=dict(loras.registered)
    )
    return JSONResponse(result)


@router.post("/unload_lora_adapter")
@with_checked_body
async def unload_lora_adapter(request: Request, body: Any) -> Response:
    fake = _fake(request)
    error = await fake.loras.unload(body["lora_name"])
    if error is not None:
        result = fake.contract.example("LoRAUpdateOutput", success=False, error_message=error)
        return JSONResponse(result, status_code=400)
    return JSONResponse(fake.contract.example("LoRAUpdateOutput", success=True))


@router.get("/v1/models")
async def models(request: Request) -> Response:
    fake = _fake(request)
    contract, served = fake.contract, fake.state.served_name
    cards = [contract.example("ModelCard", id=served, root=served)]
    if fake.options.enable_lora:
        cards += [
            contract.example("ModelCard", id=name, root=path, parent=served)
            for name, path in fake.loras.registered.items()
        ]
    return JSONResponse(contract.example("ModelList", data=cards))


def _metadata(generation: Generation) -> dict[str, Any]:
    meta: dict[str, Any] = {"weight_version": generation.spans[-1]["version"]}
    if len(generation.spans) > 1:
        meta["weight_versions"] = [dict(span) for span in generation.spans]
    return meta


def _bad_request(message: str) -> Response:
    error = {"object": "error", "message": message, "type": "BadRequestError"}
    return JSONResponse({**error, "param": None, "code": 400}, status_code=400)


async def _generate(request: Request, body: Any, chat: bool) -> Response:
    fake = _fake(request)
    state, shapes = fake.state, fake.shapes
    prompt = prompt_of(request.url.path, body)
    max_tokens = max_tokens_of(body)
    model = body.get("model") or state.served_name
    adapter = fake.adapter_of(model, body.get("lora_path"))
    refusal = fake.lora_refusal(adapter)
    if refusal is not None:
        return _bad_request(refusal)
    admission = LoraRequest(fake.loras, adapter) if adapter is not None else None
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-fake"
    if body.get("stream"):

        def chunk(generation: Generation, token: str, last: bool) -> dict[str, Any]:
            choice = shapes.choice(
                chat, True, token, finish_reason=generation.finish_reason if last else None
            )
            return shapes.response(chat, True, model, request_id, [choice])

        return StreamingResponse(
            stream_generation(state, prompt, max_tokens, chunk, admission=admission),
            media_type="text/event-stream",
        )

    async def no_stream(generation: Generation, token: str) -> None:
        return None

    try:
        generation = await state.generate(prompt, max_tokens, no_stream, admission=admission)
    except ValueError as err:  # the adapter was unloaded while the request waited
        return _bad_request(str(err))
    choice = shapes.choice(
        chat, False, "".join(generation.text), finish_reason=generation.finish_reason
    )
    answer = shapes.response(
        chat,
        False,
        model,
        request_id,
        [choice],
        usage=shapes.usage(generation),
        metadata=_metadata(generation) if generation.spans else None,
    )
    return JSONResponse(answer)


@router.post("/v1/completions")
@with_checked_body
async def completions(request: Request, body: Any) -> Response:
    return await _generate(request, body, chat=False)


@router.post("/v1/chat/completions")
@with_checked_body
async def chat_completions(request: Request, body: Any) -> Response:
    return await _generate(request, body, chat=True)


def create_app(options: SGLangOptions, contract: EngineContract | None = None) -> FastAPI:
    """The fake server: the module's routes over one :class:`FakeSGLang`."""
    contract = contract or EngineContract.load("sglang")
    check_lora_args(
        enable_lora=options.enable_lora,
        lora_paths=options.lora_paths,
        max_lora_rank=options.max_lora_rank,
        lora_target_modules=options.lora_target_modules,
    )
    state = FakeEngineState(
        version=options.weight_version,
        served_name=options.served_name or options.model_path,
        model_path=options.model_path,
        rules=Rules(),
        token_interval=options.token_interval,
    )
    loras = FakeLoraRegistry(adapter_dir_exists(options.root))
    state.details["lora"] = loras.describe

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if options.weights is not None:
            await state.load(options.weights)
        yield

    app = FastAPI(
        title="fake sglang", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.engine = state
    app.state.fake = FakeSGLang(options, contract, state, OpenAIShapes(contract), loras)
    app.middleware("http")(authenticate)
    # The routes themselves, not an included router: tests read them back from app.routes.
    app.router.routes.extend(router.routes)
    add_test_controls(app, state)
    return app
