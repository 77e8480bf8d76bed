"""A recorder that holds every request to the released engine's route table.

:class:`ReleasedRecorder` is the contract tests' ``MockTransport``: before answering, it
checks each request an adapter sends (method, path, query parameters and their types,
body fields, required ones, content type) against the route table and models extracted
from the released wheel (``tests/fixtures/engines/<engine>-<version>``), and it applies
the engine's own key rules. Scripted answers go through :func:`answer`, which refuses keys
the released handler never produces, and through ``contract.example`` for whole models,
so a test cannot hand an adapter a shape the real server would never send.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from hotload.testing.contract import ContractViolation, EngineContract
from hotload.testing.sglang_app import auth_refusal
from tests.unit.engines.recorder import Recorder, Sent

SGLANG = EngineContract.load("sglang")
VLLM = EngineContract.load("vllm")


@dataclass
class ReleasedRecorder(Recorder):
    """A :class:`Recorder` that fails the test on a request the released server refuses."""

    contract: EngineContract = SGLANG
    api_key: str | None = None
    """The key the engine was started with (``--api-key``)."""
    admin_api_key: str | None = None
    """SGLang's ``--admin-api-key``."""
    violations: list[str] = field(default_factory=list)
    probed: list[str] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.contract.engine == "vllm" and request.url.path == "/openapi.json":
            return self._openapi()
        raw = request.content
        body = json.loads(raw) if raw else None
        query: dict[str, list[str]] = {}
        for key, value in request.url.params.multi_items():
            query.setdefault(key, []).append(value)
        try:
            route = self.contract.check_request(
                request.method,
                request.url.path,
                query,
                body,
                content_type=request.headers.get("content-type"),
            )
        except ContractViolation as err:
            self.violations.append(str(err))
            raise
        refused = self._refused(route.auth, request)
        if refused is not None:
            self.sent.append(
                Sent(request.method, request.url.path, query, body, dict(request.headers))
            )
            return httpx.Response(refused, json={"error": "Unauthorized"})
        return super().handle(request)

    def _openapi(self) -> httpx.Response:
        """vLLM's FastAPI app serves its OpenAPI schema (unless ``--disable-fastapi-docs``),
        which no decorated route of the wheel declares: the schemas of the released
        request models, as FastAPI writes them (``components.schemas.<Model>.properties``).
        Kept out of :attr:`sent`: it is the adapter's probe, not part of a swap."""
        self.probed.append("/openapi.json")
        schemas = {
            name: {"properties": {field: {} for field in model["fields"]}}
            for name, model in self.contract.models.items()
        }
        return httpx.Response(200, json={"components": {"schemas": schemas}})

    def _refused(self, level: str, request: httpx.Request) -> int | None:
        header = request.headers.get("authorization")
        path = request.url.path
        if self.contract.engine == "sglang":
            return auth_refusal(level, path, header, self.api_key, self.admin_api_key)
        guarded = tuple(self.contract.settings["api_key_guarded_prefixes"])
        if self.api_key and path.startswith(guarded) and header != f"Bearer {self.api_key}":
            return 401
        return None


def answer(
    contract: EngineContract, method: str, path: str, payload: Any, status: int = 200
) -> httpx.Response:
    """A scripted answer whose keys the released handler does produce."""
    contract.check_answer(method, path, payload)
    return httpx.Response(status, json=payload)


def text_answer(text: str, status: int = 200) -> httpx.Response:
    """A plain-text answer (vLLM's LoRA routes, SGLang's ``/flush_cache``)."""
    return httpx.Response(status, text=text)


def vllm_error(message: str, kind: str, code: int) -> httpx.Response:
    """vLLM's ``ErrorResponse``, as its exception handlers serialise it."""
    error = VLLM.example("ErrorInfo", message=message, type=kind, code=code)
    return httpx.Response(code, json=VLLM.example("ErrorResponse", error=error))
