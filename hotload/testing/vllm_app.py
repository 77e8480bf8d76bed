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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from hotload.errors import ConfigError, EngineRejected
from hotload.mounts import host_path
from hotload.testing.contract import EngineContract, parse_bool_query
from hotload.testing.http import (
    OpenAIShapes,
    add_test_controls,
    checked_body,
    max_tokens_of,
    prompt_of,
    stream_generation,
    with_checked_body,
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


@dataclass
class FakeVLLM:
    """One fake server's state (``app.state.fake``): what every route reads."""

    options: VLLMOptions
    contract: EngineContract
    state: FakeEngineState
    shapes: OpenAIShapes
    served: str
    guarded: tuple[str, ...]
    loras: dict[str, str] = field(default_factory=dict)
    """Runtime-loaded LoRA adapters: name -> path."""

    def exists(self, method: str, path: str) -> bool:
        """The released server has this route with this server's settings."""
        route = self.contract.routes.get((method, path))
        if route is None:
            return path.startswith("/hotload_fake/")
        flags = {
            "VLLM_SERVER_DEV_MODE": self.options.dev_mode,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": self.options.runtime_lora,
        }
        return all(flags.get(flag, False) for flag in route.requires_env)

    async def body_of(self, request: Request) -> Any:
        return await checked_body(request, self.contract)


def _fake(request: Request) -> FakeVLLM:
    fake: FakeVLLM = request.app.state.fake
    return fake


router = APIRouter()


async def released_surface(request: Request, call_next: Any) -> Response:
    """The API key on the guarded prefixes, and 404 for a route the server lacks."""
    fake, path = _fake(request), request.url.path
    key = fake.options.api_key
    if key and path.startswith(fake.guarded):
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token != key:
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
    if not fake.exists(request.method, path):
        return JSONResponse(error_body("Not Found", "Not Found", 404), status_code=404)
    response: Response = await call_next(request)
    return response


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.post("/pause")
@with_checked_body
async def pause(request: Request, _body: Any) -> Response:
    fake = _fake(request)
    state = fake.state
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


@router.post("/resume")
@with_checked_body
async def resume(request: Request, _body: Any) -> Response:
    fake = _fake(request)
    await fake.state.resume()
    return JSONResponse({"status": "resumed"})


@router.get("/is_paused")
async def is_paused(request: Request) -> Response:
    return JSONResponse({"is_paused": _fake(request).state.paused is not None})


@router.post("/collective_rpc")
@with_checked_body
async def collective_rpc(request: Request, body: Any) -> Response:
    fake = _fake(request)
    if body.get("method") != "reload_weights":
        message = f"the fake runs only reload_weights, not {body.get('method')!r}"
        return JSONResponse(error_body(message, "NotImplementedError", 501), 501)
    kwargs = body.get("kwargs") or {}
    try:
        await fake.state.load(host_path(str(kwargs.get("weights_path", "")), fake.options.root))
    except (LoadFailedMidway, EngineRejected, ConfigError) as err:
        # No rollback in 0.33.0: layers already reloaded stay reloaded.
        return JSONResponse(error_body(str(err), "InternalServerError", 500), 500)
    return JSONResponse({"results": [None]})


@router.post("/update_weight_version")
@with_checked_body
async def update_weight_version(request: Request, body: Any) -> Response:
    fake = _fake(request)
    fake.state.version = body["new_version"]
    return JSONResponse({"success": True, "new_version": fake.state.version})


@router.get("/weight_info")
async def weight_info(request: Request) -> Response:
    return JSONResponse({"weight_version": _fake(request).state.version})


@router.post("/weight_checker")
@with_checked_body
async def weight_checker(request: Request, body: Any) -> Response:
    fake = _fake(request)
    state = fake.state
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


@router.get("/server_info")
@with_checked_body
async def server_info(request: Request, _body: Any) -> Response:
    fake = _fake(request)
    instance_id, model = fake.state.instance_id, fake.options.model
    config: Any = {"instance_id": instance_id, "model_config": {"model": model}}
    if request.query_params.get("config_format", "text") == "text":
        config = f"VllmConfig(instance_id={instance_id!r}, model={model!r})"
    return JSONResponse({"vllm_config": config, "vllm_env": {}, "system_env": {}})


@router.post("/reset_prefix_cache")
@with_checked_body
async def reset_prefix_cache(request: Request, _body: Any) -> Response:
    fake = _fake(request)
    return JSONResponse({"success": await fake.state.flush(timeout=0, ignore_held=False)})


@router.post("/v1/load_lora_adapter")
@with_checked_body
async def load_lora_adapter(request: Request, body: Any) -> Response:
    fake = _fake(request)
    name, path = body["lora_name"], body["lora_path"]
    if name in fake.loras and not body.get("load_inplace", False):
        message = (
            f"The lora adapter '{name}' has already been loaded. If you want to load the "
            "adapter in place, set 'load_inplace' to True."
        )
        return JSONResponse(error_body(message, "InvalidUserInput", 400), 400)
    try:
        found = host_path(path, fake.options.root).is_dir()
    except ConfigError:
        found = False
    if not found:
        message = f"Loading lora {name} failed: No adapter found for {path}"
        return JSONResponse(error_body(message, "NotFoundError", 404), 404)
    fake.loras[name] = path
    return Response(f"Success: LoRA adapter '{name}' added successfully.", status_code=200)


@router.post("/v1/unload_lora_adapter")
@with_checked_body
async def unload_lora_adapter(request: Request, body: Any) -> Response:
    fake = _fake(request)
    name = body["lora_name"]
    if fake.loras.pop(name, None) is None:
        message = f"The lora adapter '{name}' cannot be found."
        return JSONResponse(error_body(message, "NotFoundError", 404), 404)
    return Response(f"Success: LoRA adapter '{name}' removed successfully.", status_code=200)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    fake = _fake(request)
    contract, served = fake.contract, fake.served
    cards = [contract.example("ModelCard", id=served, root=fake.options.model)]
    cards += [
        contract.example("ModelCard", id=name, root=path, parent=served)
        for name, path in fake.loras.items()
    ]
    return JSONResponse(contract.example("ModelList", data=cards))


async def _generate(request: Request, body: Any, chat: bool) -> Response:
    fake = _fake(request)
    state, shapes, served = fake.state, fake.shapes, fake.served
    model = body.get("model") or served
    if model != served and model not in fake.loras:
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


@router.post("/v1/completions")
@with_checked_body
async def completions(request: Request, body: Any) -> Response:
    return await _generate(request, body, chat=False)


@router.post("/v1/chat/completions")
@with_checked_body
async def chat_completions(request: Request, body: Any) -> Response:
    return await _generate(request, body, chat=True)


def create_app(options: VLLMOptions, contract: EngineContract | None = None) -> FastAPI:
    """The fake server: the module's routes over one :class:`FakeVLLM`."""
    contract = contract or EngineContract.load("vllm")
    served = options.served_name or options.model
    state = FakeEngineState(
        version=str(contract.settings.get("initial_weight_version", "default")),
        served_name=served,
        model_path=options.model,
        rules=Rules(new_requests_refused_when=frozenset({Pause.ABORT, Pause.WAIT})),
        token_interval=options.token_interval,
    )
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
    app.state.fake = FakeVLLM(options, contract, state, OpenAIShapes(contract), served, guarded)
    app.middleware("http")(released_surface)
    # The routes themselves, not an included router: tests read them back from app.routes.
    app.router.routes.extend(router.routes)
    add_test_controls(app, state)
    return app
