"""An httpx MockTransport that records every request and answers from a script.

Contract tests pin the exact requests an adapter sends (method, path, query, JSON body):
the real SGLang and vLLM cannot run here, so this is where their API is held to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Answer = httpx.Response | Callable[[httpx.Request], httpx.Response]


@dataclass(frozen=True)
class Sent:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


@dataclass
class Recorder:
    """Answers ``(method, path)`` from ``routes`` (a list is consumed in order); 404 otherwise."""

    routes: dict[tuple[str, str], Answer | list[Answer]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        raw = request.content
        body = json.loads(raw) if raw else None
        query: dict[str, list[str]] = {}
        for key, value in request.url.params.multi_items():
            query.setdefault(key, []).append(value)
        self.sent.append(Sent(request.method, request.url.path, query, body, dict(request.headers)))
        answer = self.routes.get((request.method, request.url.path))
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if answer is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return answer(request) if callable(answer) else answer

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    def calls(self) -> list[tuple[str, str, dict[str, list[str]], Any]]:
        return [(sent.method, sent.path, sent.query, sent.body) for sent in self.sent]


def ok(body: Any = None) -> httpx.Response:
    return httpx.Response(200, json=body if body is not None else {})
