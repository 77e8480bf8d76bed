"""A server that answers like vLLM 0.33.0's OpenAI server for what hotload uses.

Behaviour copied from the released source (docs/engines.md lists it): the admin routes
exist only with ``VLLM_SERVER_DEV_MODE=1``, the LoRA routes only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``; only ``/v1``-like prefixes take the API key;
``POST /pause`` clears the prefix cache and preempts running requests in every mode unless
``clear_cache=false`` (``keep`` included); new requests get 503 while paused in ``abort``
or ``wait``; ``collective_rpc reload_weights`` replaces weights layer by layer with no
rollback (a failure midway leaves them mixed; the version is untouched); the weight version
starts at ``"default"``; ``/server_info?config_format=json`` carries the instance id (the
start time in ns); per-choice ``weight_versions`` spans come with
``return_weight_versions`` and, when streaming, only in the last chunk; unknown routes
and missing adapters both answer 404, told apart by the error's ``type``; ``GET
/is_paused`` says whether a pause holds (``entrypoints/rl/online/api_router.py``, dev mode;
``tests/fixtures/engines/vllm-0.33.0/routes.json``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from hotload.errors import ConfigError, EngineRejected
from hotload.mounts import host_path
from hotload.testing.contract import ContractViolation, EngineContract, parse_bool_query
from hotload.testing.http import (
    OpenAIShapes,
    add_test_controls,
    checked_body,
    max_tokens_of,
    prompt_of,
    refuse,
    stream_generation,
)
from hotload.testing.state import (
    FakeEngineState,
    Generation,
    Pause,
    RefusedWhilePaused,
    Rules,
)
from hotload.testing.weights import LoadFailedMidway

_PAUSES = {"abort": Pause.ABORT, "wait": Pause.WAIT, "keep": Pause.IN_PLACE}


@dataclass(frozen=True)
class VLLMOptions:
    model: str
    served_name: str | None = None
    weights: Path | None = None
    api_key: str | None = None
    dev_mode: bool = False
    """``VLLM_SERVER_DEV_MODE=1``."""
    runtime_lora: bool = False
    """``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (with ``--enable-lora``)."""
    token_interval: float = 0.02
    root: Path | None = None


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` as its exception handlers serialise it."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def create_app(options: VLLMOptions, contract: EngineContract | None = None) -> FastAPI:
    contract = contract or EngineContract.load("vllm")
    served = options.served_name or options.model
    state = FakeEngineState(
        version=str(contract.settings.get("initial_weight_version", "default")),
        served_name=served,
        model_path=options.model,
        rules=Rules(new_requests_refused_when=frozenset({Pause.ABORT, Pause.WAIT})),
        token_interval=options.token_interval,
    )
    shapes = OpenAIShapes(contract)
    loras: dict[str, str] = {}
    guarded = tuple(contract.settings.get("api_key_guarded_prefixes", ("/v1",)))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if options.weights is not None:
            await state.load(options.weights)
        yield

    app = FastAPI(
        title="fake vllm", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.engine = state

    def exists(method: str, path: str) -> bool:
        route = contract.routes.get((method, path))
        if route is None:
            return path.startswith("/hotload_fake/")
        flags = {
            "VLLM_SERVER_DEV_MODE": options.dev_mode,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": options.runtime_lora,
        }
        return all(flags.get(flag, False) for flag in route.requires_env)

    @app.middleware("http")
    async def released_surface(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if options.api_key and path.startswith(guarded):
            header = request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or token != options.api_key:
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if not exists(request.method, path):
            return JSONResponse(error_body("Not Found", "Not Found", 404), status_code=404)
        response: Response = await call_next(request)
        return response

    async def body_of(request: Request) -> Any:
        return await checked_body(request, contract)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.post("/pause")
    async def pause(request: Request) -> Response:
        try:
            await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        mode = _PAUSES[request.query_params.get("mode", "abort")]
        clear_cache = parse_bool_query(request.query_params.get("clear_cache", "true"))
        await state.pause(mode)
        if clear_cache:
            # EngineCore._finish_pause -> _reset_caches(reset_running_requests=True), in
            # every mode: running requests are preempted, the prefix cache is wiped.
            state.preempt("preempted")
            state.cache.clear()
            state.counters["pause_cache_clears"] += 1
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume(request: Request) -> Response:
        try:
            await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        await state.resume()
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused() -> Response:
        return JSONResponse({"is_paused": state.paused is not None})

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        if body.get("method") != "reload_weights":
            message = f"the fake runs only reload_weights, not {body.get('method')!r}"
            return JSONResponse(error_body(message, "NotImplementedError", 501), 501)
        kwargs = body.get("kwargs") or {}
        try:
            await state.load(host_path(str(kwargs.get("weights_path", "")), options.root))
        except (LoadFailedMidway, EngineRejected, ConfigError) as err:
            # No rollback in 0.33.0: layers already reloaded stay reloaded.
            return JSONResponse(error_body(str(err), "InternalServerError", 500), 500)
        return JSONResponse({"results": [None]})

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        state.version = body["new_version"]
        return JSONResponse({"success": True, "new_version": state.version})

    @app.get("/weight_info")
    async def weight_info() -> Response:
        return JSONResponse({"weight_version": state.version})

    @app.post("/weight_checker")
    async def weight_checker(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        if body["action"] == "reset":
            state.store.scramble()
            state.digest = state.store.digest()
            return JSONResponse({"status": "reset"})
        checksums = state.store.checksums()
        if body["action"] == "checksum":
            return JSONResponse({"checksums": checksums})
        baseline = body.get("baseline")
        if baseline is None:
            detail = "action='compare' requires a 'baseline' object"
            return JSONResponse(error_body(detail, "Bad Request", 400), 400)
        mismatches = sorted(
            k for k in checksums.keys() | baseline.keys() if checksums.get(k) != baseline.get(k)
        )
        return JSONResponse({"match": not mismatches, "mismatches": mismatches})

    @app.get("/server_info")
    async def server_info(request: Request) -> Response:
        try:
            await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        config: Any = {"instance_id": state.instance_id, "model_config": {"model": options.model}}
        if request.query_params.get("config_format", "text") == "text":
            config = f"VllmConfig(instance_id={state.instance_id!r}, model={options.model!r})"
        return JSONResponse({"vllm_config": config, "vllm_env": {}, "system_env": {}})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        try:
            await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        return JSONResponse({"success": await state.flush(timeout=0, ignore_held=False)})

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        name, path = body["lora_name"], body["lora_path"]
        if name in loras and not body.get("load_inplace", False):
            message = (
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True."
            )
            return JSONResponse(error_body(message, "InvalidUserInput", 400), 400)
        try:
            found = host_path(path, options.root).is_dir()
        except ConfigError:
            found = False
        if not found:
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return JSONResponse(error_body(message, "NotFoundError", 404), 404)
        loras[name] = path
        return Response(f"Success: LoRA adapter '{name}' added successfully.", status_code=200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        name = body["lora_name"]
        if loras.pop(name, None) is None:
            message = f"The lora adapter '{name}' cannot be found."
            return JSONResponse(error_body(message, "NotFoundError", 404), 404)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", status_code=200)

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [contract.example("ModelCard", id=served, root=options.model)]
        cards += [
            contract.example("ModelCard", id=name, root=path, parent=served)
            for name, path in loras.items()
        ]
        return JSONResponse(contract.example("ModelList", data=cards))

    async def generate(request: Request, chat: bool) -> Response:
        try:
            body = await body_of(request)
        except ContractViolation as err:
            return refuse(err)
        model = body.get("model") or served
        if model != served and model not in loras:
            message = f"The model `{model}` does not exist."
            return JSONResponse(error_body(message, "NotFoundError", 404), 404)
        prompt = prompt_of(request.url.path, body)
        max_tokens = max_tokens_of(body)
        spans_wanted = bool(body.get("return_weight_versions"))
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-fake"

        def spans(generation: Generation) -> list[dict[str, Any]] | None:
            return [dict(s) for s in generation.spans] if spans_wanted else None

        if body.get("stream"):

            def chunk(generation: Generation, token: str, last: bool) -> dict[str, Any]:
                choice = shapes.choice(
                    chat,
                    True,
                    token,
                    finish_reason=generation.finish_reason if last else None,
                    weight_versions=spans(generation) if last else None,
                )
                return shapes.response(chat, True, model, request_id, [choice])

            try:
                state.check_accepting()
            except RefusedWhilePaused:
                return JSONResponse(error_body("paused", "ServiceUnavailableError", 503), 503)
            return StreamingResponse(
                stream_generation(state, prompt, max_tokens, chunk),
                media_type="text/event-stream",
            )

        async def no_stream(generation: Generation, token: str) -> None:
            return None

        try:
            generation = await state.generate(prompt, max_tokens, no_stream)
        except RefusedWhilePaused:
            return JSONResponse(error_body("paused", "ServiceUnavailableError", 503), 503)
        choice = shapes.choice(
            chat,
            False,
            "".join(generation.text),
            finish_reason=generation.finish_reason,
            weight_versions=spans(generation),
        )
        answer = shapes.response(
            chat, False, model, request_id, [choice], usage=shapes.usage(generation)
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
