"""The sidecar's HTTP surface: probes, status, metrics, and the OpenAI-compatible front.

- ``/healthz``: the process serves HTTP (liveness).
- ``/readyz``: it serves HTTP *and* the engine answers (the pod's readiness probe; the
  snapshot is the readiness gate's job, not this one).
- ``/status``: :class:`~hotload.sidecar.status.StatusReport` as JSON.
- ``/metrics``: the agent's own Prometheus registry.
- ``/v1/*``: proxied to the engine with streaming pass-through; every response and every
  streamed chunk names its policy (``model: <servedName>@<identity>``), every response
  carries ``x-hotload-policy`` (for a stream, the identity it started on), and the
  session header ``x-multi-turn-session-id`` passes through both ways. Around swaps the
  :class:`~hotload.sidecar.swap_gate.SwapGate` holds (ASYNC) or refuses with 425 (SYNC).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from hotload.api.pod import POLICY_HEADER
from hotload.engines.protocol import Engine
from hotload.sidecar.metrics import AgentMetrics
from hotload.sidecar.policy_label import PolicyLabeler, SseRelabeler
from hotload.sidecar.status import StatusReport
from hotload.sidecar.swap_gate import HoldTimeout, SwapGate, TooEarly

log = logging.getLogger(__name__)

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


def _forward_headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}


def _strip_policy(model: Any) -> Any:
    """A client may name ``<served>@<identity>`` back to us; the engine knows ``<served>``."""
    return model.split("@", 1)[0] if isinstance(model, str) else model


def build_front(source: FrontSource, client: httpx.AsyncClient) -> FastAPI:
    """The FastAPI app of one agent (its own routes, registry and HTTP client)."""
    app = FastAPI(title="hotload sidecar", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        engine = source.current_engine()
        if engine is None:
            return JSONResponse({"status": "no engine yet"}, status_code=503)
        if not await engine.health():
            return JSONResponse({"status": "engine not answering"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/status")
    async def status() -> Response:
        report = source.status_report()
        return JSONResponse(report.model_dump(mode="json", by_alias=True))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(source.registry), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def proxy(path: str, request: Request) -> Response:
        return await _proxy(source, client, f"/v1/{path}", request)

    return app


async def _proxy(
    source: FrontSource, client: httpx.AsyncClient, path: str, request: Request
) -> Response:
    engine = source.current_engine()
    served_name = source.served_name()
    serving = source.served_identity()
    if engine is None or engine.base_url is None or served_name is None:
        return _error(
            503, "no engine to serve this request yet", "engine_unavailable", policy=serving
        )
    raw = await request.body()
    body: dict[str, Any] | None = None
    if raw and request.method == "POST":
        try:
            parsed = json.loads(raw)
        except ValueError:
            return _error(
                400, "the request body is not JSON", "invalid_request_error", policy=serving
            )
        if isinstance(parsed, dict):
            parsed["model"] = _strip_policy(parsed.get("model", served_name))
            body = engine.prepare_request(path, parsed)
    streaming = bool(body and body.get("stream"))
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
    labeler = PolicyLabeler(served_name, engine.identities_of, source.served_identity)
    outbound = client.build_request(
        request.method,
        f"{engine.base_url}{path}",
        params=request.query_params,
        headers=_forward_headers(request),
        content=json.dumps(body).encode() if body is not None else raw,
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
