"""A server that answers like SGLang 0.5.23's ``http_server`` for what hotload uses.

Behaviour copied from the released source (see docs/engines.md for the list): a disk
update waits for in-flight generations unless paused, names the weights
``weight_version`` and renames ``served_model_name`` and ``model_path`` to the loaded path
on success; a failed update "rolls back" by re-reading the *new* path, so the weights are
left part new, part old while ``/model_info`` still names the old version; ``/health``
runs a generation (held by a pause: 503 after ``SGLANG_HEALTH_CHECK_TIMEOUT``) unless
``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``; ``/ready`` does not; ``/flush_cache``
refuses while the running batch is not empty (a ``retract`` pause empties it, an
``in_place`` one does not); non-streamed ``/v1`` answers carry
``metadata.weight_version(s)``, stream chunks carry none; admin routes take the admin key
when one is set, ``/model_info`` and ``/v1`` the API key.
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
    state = FakeEngineState(
        version=options.weight_version,
        served_name=options.served_name or options.model_path,
        model_path=options.model_path,
        rules=Rules(),
        token_interval=options.token_interval,
    )
    shapes = OpenAIShapes(contract)
    loras: dict[str, str] = {}

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
            version = body.get("weight_version")
            if version is not None:
                state.version = version
            state.model_path = path
            state.served_name = path
            if body.get("flush_cache", True) and not await state.flush(
                timeout=0, ignore_held=state.paused is not None
            ):
                return False, "Failed to flush cache after weight update."
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
        if await state.flush(timeout=timeout, ignore_held=state.paused is not None):
            return Response("Cache flushed.\n", status_code=200)
        return Response("Flush cache failed.\n", status_code=400)

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
        if not options.enable_lora:
            result = contract.example(
                "LoRAUpdateOutput",
                success=False,
                error_message="LoRA is not enabled. Please set `--enable-lora` to True.",
            )
            return JSONResponse(result, status_code=400)
        if not local(body["lora_path"]).is_dir():
            result = contract.example(
                "LoRAUpdateOutput", success=False, error_message="lora_path not found"
            )
            return JSONResponse(result, status_code=400)
        loras[body["lora_name"]] = body["lora_path"]
        result = contract.example("LoRAUpdateOutput", success=True, loaded_adapters=dict(loras))
        return JSONResponse(result)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        if loras.pop(body["lora_name"], None) is None:
            result = contract.example(
                "LoRAUpdateOutput", success=False, error_message="adapter not loaded"
            )
            return JSONResponse(result, status_code=400)
        return JSONResponse(contract.example("LoRAUpdateOutput", success=True))

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [contract.example("ModelCard", id=state.served_name, root=state.served_name)]
        cards += [
            contract.example("ModelCard", id=name, root=path, parent=state.served_name)
            for name, path in loras.items()
        ]
        return JSONResponse(contract.example("ModelList", data=cards))

    def metadata(generation: Generation) -> dict[str, Any]:
        meta: dict[str, Any] = {"weight_version": generation.spans[-1]["version"]}
        if len(generation.spans) > 1:
            meta["weight_versions"] = [dict(span) for span in generation.spans]
        return meta

    def lora_refusal(model: str, lora_path: Any) -> str | None:
        """``serving_base._parse_model_parameter`` + ``_resolve_lora_path``: a ``model``
        that is not the served name and holds a colon names an adapter (``base:adapter``)."""
        adapter = lora_path if isinstance(lora_path, str) else None
        if ":" in model and model != state.served_name:
            prefix = f"{state.served_name}:"
            adapter = model[len(prefix) :] if model.startswith(prefix) else model.split(":")[1]
        if not adapter:
            return None
        if not options.enable_lora:
            return f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled."
        if adapter not in loras:
            return f"Got LoRA adapter that has never been loaded: {adapter}"
        return None

    async def generate(request: Request, chat: bool) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        prompt = prompt_of(request.url.path, body)
        max_tokens = max_tokens_of(body)
        model = body.get("model") or state.served_name
        refusal = lora_refusal(model, body.get("lora_path"))
        if refusal is not None:
            error = {"object": "error", "message": refusal, "type": "BadRequestError"}
            return JSONResponse({**error, "param": None, "code": 400}, status_code=400)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-fake"
        if body.get("stream"):

            def chunk(generation: Generation, token: str, last: bool) -> dict[str, Any]:
                choice = shapes.choice(
                    chat, True, token, finish_reason=generation.finish_reason if last else None
                )
                return shapes.response(chat, True, model, request_id, [choice])

            return StreamingResponse(
                stream_generation(state, prompt, max_tokens, chunk),
                media_type="text/event-stream",
            )

        async def no_stream(generation: Generation, token: str) -> None:
            return None

        generation = await state.generate(prompt, max_tokens, no_stream)
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
