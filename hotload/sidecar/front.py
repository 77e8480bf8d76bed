"""The sidecar's HTTP surface: probes, status, metrics, and the OpenAI-compatible front.

It is the pod's one serving port (the engine listens inside the pod only: docs/security.md),
so what it forwards is an allow-list, never a prefix:

- ``GET /healthz``: the process serves HTTP (liveness).
- ``GET /readyz``: it serves HTTP *and* the engine answers (the pod's readiness probe; the
  snapshot is the readiness gate's job, not this one).
- ``GET /status``: :class:`~hotload.sidecar.status.StatusReport` as JSON.
- ``GET /metrics``: the agent's own Prometheus registry.
- :data:`OPENAI_ROUTES` (``GET /v1/models``, ``POST /v1/completions``, ``POST
  /v1/chat/completions``): proxied to the engine under their own, constant path, with
  streaming pass-through; every response and every streamed chunk names its policy
  (``model: <servedName>@<identity>``), every response carries ``x-hotload-policy`` (for a
  stream, the identity it started on), and the session header ``x-multi-turn-session-id``
  passes through both ways. Around swaps the :class:`~hotload.sidecar.swap_gate.SwapGate`
  holds (ASYNC) or refuses with 425 (SYNC).

Everything else is refused before it reaches a handler: a request path that is not plain
``/segment/segment`` (a dot segment, a percent-escape such as ``%2e`` or ``%2F``, a
backslash, an empty segment) is 400, an unknown path 404 — the engine's admin routes
(``/admin/*``, vLLM's ``/v1/load_lora_adapter``, SGLang's ``/update_weights_from_disk``)
are never reachable through the front. Bodies are capped (``413`` past
``max_request_bytes``), must be one JSON object (``400`` otherwise) and nest at most
``max_json_depth`` deep (``400``).

The handlers are module-level functions over one :class:`FrontState` in the app's state,
so the routes are read in one place and each agent's app holds only its own state.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import httpx
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from hotload.api.pod import POLICY_HEADER
from hotload.engines.protocol import Engine
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.policy_label import PolicyLabeler, SseRelabeler
from hotload.sidecar.status import StatusReport
from hotload.sidecar.swap_gate import HoldTimeout, SwapGate, TooEarly

log = logging.getLogger(__name__)

#: The engine routes the front forwards, and the one method of each: nothing else of the
#: engine is reachable through the pod's port.
OPENAI_ROUTES: Final[Mapping[str, str]] = {
    "/v1/models": "GET",
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
}
#: Default cap of a request body (a long chat with tools is well under a megabyte).
DEFAULT_MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
#: Default cap of a request body's JSON nesting (OpenAI requests nest a handful deep).
DEFAULT_MAX_JSON_DEPTH: Final = 64
#: A path the front will route: ``/`` then plain segments, nothing to decode or normalise.
_PLAIN_PATH: Final = re.compile(rb"(?:/[A-Za-z0-9_-]+)+")

#: Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus those we set.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
    }
)
#: Also listing every identity when a response spans a swap (ASYNC).
POLICIES_HEADER = "x-hotload-policies"


class FrontSource(Protocol):
    """What the front reads from its agent."""

    @property
    def gate(self) -> SwapGate: ...

    @property
    def metrics(self) -> AgentMetrics: ...

    @property
    def registry(self) -> CollectorRegistry: ...

    def current_engine(self) -> Engine | None:
        """The engine adapter, once the deployment named it."""
        ...

    def served_name(self) -> str | None:
        """``spec.model.servedName`` of the deployment."""
        ...

    def served_identity(self) -> str | None:
        """The identity the engine serves now, verified and confirmed by its last report
        (None: nothing verified; only the engine's own labels then name a policy)."""
        ...

    def status_report(self) -> StatusReport: ...


@dataclass(frozen=True)
class FrontState:
    """One agent's front: what its handlers read (``app.state.front``)."""

    source: FrontSource
    client: httpx.AsyncClient
    """The front's HTTP client to the engine (borrowed: the agent closes it)."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH


def _front(request: Request) -> FrontState:
    state: FrontState = request.app.state.front
    return state


def _error(
    status: int,
    message: str,
    kind: str,
    headers: dict[str, str] | None = None,
    *,
    policy: str | None = None,
) -> Response:
    """An OpenAI-shaped error body; ``policy`` (what the replica serves) goes into
    ``x-hotload-policy`` so even a refusal says which policy the replica is on."""
    headers = dict(headers or {})
    if policy:
        headers[POLICY_HEADER] = policy
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}},
        status_code=status,
        headers=headers,
    )


class PlainPathGuard:
    """ASGI middleware: refuse (400) any request whose raw path is not plain segments.

    uvicorn hands the app a percent-decoded path (``%2e%2e`` becomes ``..``, ``%2F`` a
    slash) and the HTTP client that forwards normalises dot segments: judging the raw
    bytes here, before routing, leaves nothing for either to reinterpret. Routes then match
    exactly (no trailing-slash redirects), so the path forwarded is always a constant.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or str(scope.get("path", "")).encode("latin-1")
            if not _PLAIN_PATH.fullmatch(raw):
                refusal = _error(400, "the request path is not a plain path", "invalid_path")
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    engine = _front(request).source.current_engine()
    if engine is None:
        return JSONResponse({"status": "no engine yet"}, status_code=503)
    if not await engine.health():
        return JSONResponse({"status": "engine not answering"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/status")
async def status(request: Request) -> Response:
    report = _front(request).source.status_report()
    return JSONResponse(report.model_dump(mode="json", by_alias=True))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = _front(request).source.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def proxy(request: Request) -> Response:
    """One of :data:`OPENAI_ROUTES`, forwarded under its own constant path."""
    path = request.scope["path"]
    if OPENAI_ROUTES.get(path) != request.method:  # the routes match exactly: never here
        return _error(404, "no such route", "not_found")
    return await _proxy(_front(request), path, request)


for _path, _method in OPENAI_ROUTES.items():
    router.add_api_route(_path, proxy, methods=[_method], include_in_schema=False)


def build_front(
    source: FrontSource,
    client: httpx.AsyncClient,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
) -> FastAPI:
    """The FastAPI app of one agent: the module's routes over its own state."""
    app = FastAPI(
        title="hotload sidecar",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    app.state.front = FrontState(source, client, max_request_bytes, max_json_depth)
    app.include_router(router)
    app.add_middleware(PlainPathGuard)
    return app


def _forward_headers(request: Request, *, json_body: bool) -> dict[str, str]:
    """The client's headers but one hop's own; the body forwarded is JSON the front wrote,
    and says so whatever the client declared."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
    if json_body:
        headers["content-type"] = "application/json"
    return headers


def _strip_policy(model: Any) -> Any:
    """A client may name ``<served>@<identity>`` back to us; the engine knows ``<served>``."""
    return model.split("@", 1)[0] if isinstance(model, str) else model


class _BodyRefused(Exception):
    """A request body the front will not forward; carries the answer."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects/arrays more than ``limit`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyRefused(413, f"the request body exceeds {limit} bytes", "request_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyRefused(413, f"the request body exceeds {limit} bytes", "request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(front: FrontState, request: Request) -> dict[str, Any]:
    """A POST's body: one JSON object within the front's size and depth caps."""
    raw = await _read_body(request, front.max_request_bytes)
    try:
        parsed = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        parsed = None
        deep = True
    except ValueError:
        raise _BodyRefused(400, "the request body is not JSON", "invalid_request_error") from None
    else:
        deep = _deeper_than(parsed, front.max_json_depth)
    if deep:
        raise _BodyRefused(
            400,
            f"the request body nests deeper than {front.max_json_depth}",
            "invalid_request_error",
        )
    if not isinstance(parsed, dict):
        raise _BodyRefused(400, "the request body is not a JSON object", "invalid_request_error")
    return parsed


async def _proxy(front: FrontState, path: str, request: Request) -> Response:
    source, client = front.source, front.client
    engine = source.current_engine()
    served_name = source.served_name()
    serving = source.served_identity()
    if engine is None or engine.base_url is None or served_name is None:
        return _error(
            503, "no engine to serve this request yet", "engine_unavailable", policy=serving
        )
    parsed: dict[str, Any] | None = None
    if request.method == "POST":
        try:
            parsed = await _json_body(front, request)
        except _BodyRefused as refused:
            return _error(refused.status, str(refused), refused.kind, policy=serving)
        parsed["model"] = _strip_policy(parsed.get("model", served_name))
    streaming = bool(parsed and parsed.get("stream"))
    gate = source.gate
    try:
        await gate.enter()
    except TooEarly as early:
        headers = {"Retry-After": str(early.retry_after_s)}
        return _error(
            425, "a weight swap is running; retry shortly", "too_early", headers, policy=serving
        )
    except HoldTimeout as held:
        headers = {"Retry-After": str(held.retry_after_s)}
        return _error(
            503,
            "a weight swap outlasted the hold timeout",
            "swap_timeout",
            headers,
            policy=source.served_identity(),
        )
    # Prepared once admitted, not before a hold: a request held across a swap names the
    # adapter (and model) the engine serves when it goes in, not one it just unloaded.
    body = engine.prepare_request(path, parsed) if parsed is not None else None
    labeler = PolicyLabeler(
        served_name,
        engine.identities_of,
        source.served_identity,
        trust_engine=engine.rollback_trusted,
    )
    outbound = client.build_request(
        request.method,
        f"{engine.base_url}{path}",
        headers=_forward_headers(request, json_body=body is not None),
        content=json.dumps(body).encode() if body is not None else None,
    )
    try:
        upstream = await client.send(outbound, stream=True)
    except httpx.HTTPError as err:
        gate.leave()
        log.warning("engine unreachable from the front", extra={"path": path, "error": str(err)})
        return _error(
            502,
            f"the engine cannot be reached: {type(err).__name__}",
            "engine_unavailable",
            policy=source.served_identity(),
        )
    source.metrics.proxied_requests.labels(status=str(upstream.status_code)).inc()
    headers = _response_headers(upstream)
    content_type = upstream.headers.get("content-type", "")
    if streaming and "text/event-stream" in content_type:
        return await _stream_response(upstream, SseRelabeler(labeler), gate.leave, headers)
    try:
        content = await upstream.aread()
    except httpx.HTTPError as err:
        return _error(
            502,
            f"the engine broke off: {type(err).__name__}",
            "engine_unavailable",
            policy=source.served_identity(),
        )
    finally:
        await upstream.aclose()
        gate.leave()
    if "json" in content_type:
        content = labeler.label_json(content)
    fallback = source.served_identity()
    seen = labeler.seen or ([fallback] if fallback else [])
    if seen:
        headers[POLICY_HEADER] = seen[0]
    if len(seen) > 1:
        headers[POLICIES_HEADER] = ",".join(seen)
    return Response(
        content, status_code=upstream.status_code, headers=headers, media_type=content_type or None
    )


def _response_headers(upstream: httpx.Response) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
    headers.pop("content-type", None)
    return headers


async def _stream_response(
    upstream: httpx.Response,
    relabeler: SseRelabeler,
    done: Callable[[], None],
    headers: dict[str, str],
) -> Response:
    """Stream the engine's SSE relabelled; the header names the policy of the first
    event (read before the headers go out), so it is the engine's word, not a guess."""
    chunks = upstream.aiter_raw()
    first: list[bytes] = []
    try:
        while not first:  # up to the first complete event
            chunk = await anext(chunks, None)
            if chunk is None:
                break
            out = relabeler.feed(chunk)
            if out:
                first.append(out)
    except httpx.HTTPError as err:
        log.warning("engine stream broke off", extra={"error": str(err)})
        await upstream.aclose()
        done()
        return _error(502, f"the engine broke off: {type(err).__name__}", "engine_unavailable")
    if relabeler.labeler.seen:
        headers[POLICY_HEADER] = relabeler.labeler.seen[0]
    return StreamingResponse(
        _relabel_stream(upstream, chunks, first, relabeler, done),
        status_code=upstream.status_code,
        headers=headers,
        media_type="text/event-stream",
    )


async def _relabel_stream(
    upstream: httpx.Response,
    chunks: AsyncIterator[bytes],
    first: list[bytes],
    relabeler: SseRelabeler,
    done: Callable[[], None],
) -> AsyncIterator[bytes]:
    """Pass the engine's SSE through, relabelled, chunk by chunk; release the gate at the end."""
    try:
        for out in first:
            yield out
        async for chunk in chunks:
            out = relabeler.feed(chunk)
            if out:
                yield out
        tail = relabeler.flush()
        if tail:
            yield tail
    except httpx.HTTPError as err:
        log.warning("engine stream broke off", extra={"error": str(err)})
    finally:
        await upstream.aclose()
        done()
