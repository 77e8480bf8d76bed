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

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from hotload.errors import ConfigError, EngineRejected
from hotload.mounts import host_path
from hotload.testing.contract import ContractViolation, EngineContract
from hotload.testing.http import (
    OpenAIShapes,
    add_test_controls,
    checked_body,
    max_tokens_of,
    prompt_of,
    refuse,
    stream_generation,
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


def create_app(options: SGLangOptions, contract: EngineContract | None = None) -> FastAPI:
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
    shapes = OpenAIShapes(contract)
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

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        route = contract.routes.get((request.method, request.url.path))
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

    async def body_of(request: Request) -> Any:
        return await checked_body(request, contract)

    def local(path: str) -> Path:
        return host_path(path, options.root)

    @app.get("/ready")
    async def ready() -> Response:
        # is_ready(): not paused and healthy (tokenizer_manager.py:732-734).
        return Response(status_code=503 if state.paused is not None else 200)

    @app.get("/ping")
    async def ping() -> Response:
        # is_healthy() only: a paused server is up (http_server.py:2190-2199).
        return Response(status_code=200)

    async def health_generate() -> Response:
        if not options.health_generation:
            return Response(status_code=200)
        # One token through the scheduler: a pause holds it, and after the timeout the
        # server answers 503 (and marks itself unhealthy), as 0.5.23 does.
        if state.paused is not None:
            await asyncio.sleep(options.health_timeout)
            if state.paused is not None:
                state.counters["health_timeouts"] += 1
                return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return await health_generate()

    @app.get("/health_generate")
    async def health_generate_route() -> Response:
        return await health_generate()

    @app.get("/model_info")
    async def model_info() -> Response:
        payload = {
            "model_path": state.model_path,
            "served_model_name": state.served_name,
            "tokenizer_path": options.model_path,
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
        contract.check_answer("GET", "/model_info", payload)
        return JSONResponse(payload)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        path = body["model_path"]

        async def load() -> tuple[bool, str]:
            try:
                await state.load(local(path))
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

        if state.paused is None:
            success, message = await state.exclusive(load)
        else:
            success, message = await load()
        payload = {"success": success, "message": message, "num_paused_requests": 0}
        contract.check_answer("POST", "/update_weights_from_disk", payload)
        return JSONResponse(payload, status_code=200 if success else 400)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
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

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        await state.pause(_PAUSES[body.get("mode", "abort")])
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(request: Request) -> Response:
        try:
            await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        await state.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        try:
            await body_of(request)
        except ContractViolation as err:
            return refuse(err)
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

    @app.api_route("/weights_checker", methods=["GET", "POST"])
    async def weights_checker(request: Request) -> Response:
        try:
            body = await body_of(request) or {}
        except ContractViolation as err:
            return refuse(err)
        action = body.get("action", "checksum")
        if action != "checksum":
            payload = {"success": True, "message": f"{action} done"}
            return JSONResponse(payload)
        checksums = state.store.checksums()
        info = contract.example(
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
        contract.check_answer("POST", "/weights_checker", payload)
        return JSONResponse(payload)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        error: str | None = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
        if options.enable_lora:
            error = await loras.load(body["lora_name"], body["lora_path"])
        if error is not None:
            result = contract.example("LoRAUpdateOutput", success=False, error_message=error)
            return JSONResponse(result, status_code=400)
        result = contract.example(
            "LoRAUpdateOutput", success=True, loaded_adapters=dict(loras.registered)
        )
        return JSONResponse(result)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        error = await loras.unload(body["lora_name"])
        if error is not None:
            result = contract.example("LoRAUpdateOutput", success=False, error_message=error)
            return JSONResponse(result, status_code=400)
        return JSONResponse(contract.example("LoRAUpdateOutput", success=True))

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [contract.example("ModelCard", id=state.served_name, root=state.served_name)]
        if options.enable_lora:
            cards += [
                contract.example("ModelCard", id=name, root=path, parent=state.served_name)
                for name, path in loras.registered.items()
            ]
        return JSONResponse(contract.example("ModelList", data=cards))

    def metadata(generation: Generation) -> dict[str, Any]:
        meta: dict[str, Any] = {"weight_version": generation.spans[-1]["version"]}
        if len(generation.spans) > 1:
            meta["weight_versions"] = [dict(span) for span in generation.spans]
        return meta

    def adapter_of(model: str, lora_path: Any) -> str | None:
        """``serving_base._parse_model_parameter`` + ``_resolve_lora_path``: a ``model``
        that is not the served name and holds a colon names an adapter (``base:adapter``)."""
        adapter = lora_path if isinstance(lora_path, str) else None
        if ":" in model and model != state.served_name:
            prefix = f"{state.served_name}:"
            adapter = model[len(prefix) :] if model.startswith(prefix) else model.split(":")[1]
        return adapter or None

    def lora_refusal(adapter: str | None) -> str | None:
        if adapter is None:
            return None
        if not options.enable_lora:
            return f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled."
        return loras.refusal(adapter)

    def bad_request(message: str) -> Response:
        error = {"object": "error", "message": message, "type": "BadRequestError"}
        return JSONResponse({**error, "param": None, "code": 400}, status_code=400)

    async def generate(request: Request, chat: bool) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        prompt = prompt_of(request.url.path, body)
        max_tokens = max_tokens_of(body)
        model = body.get("model") or state.served_name
        adapter = adapter_of(model, body.get("lora_path"))
        refusal = lora_refusal(adapter)
        if refusal is not None:
            return bad_request(refusal)
        admission = LoraRequest(loras, adapter) if adapter is not None else None
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
            return bad_request(str(err))
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
            metadata=metadata(generation) if generation.spans else None,
        )
        return JSONResponse(answer)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    add_test_controls(app, state)
    return app
