"""HTTP bodies of the reference engine (pydantic v2 at the edge).

OpenAI fields the engine does not implement are ignored, except ones whose silent
omission would mislead (``n`` > 1, ``stop``, ``logprobs``), which are refused with 400.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.api.identity import ValidIdentity
from hotload.engines.protocol import PauseMode

MAX_TOKENS_LIMIT = 4096


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: Annotated[int | None, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None
    temperature: Annotated[float | None, Field(ge=0.0, le=10.0)] = None
    """None or 0: greedy (the reference engine's default, unlike OpenAI's 1.0)."""
    top_p: Annotated[float | None, Field(gt=0.0, le=1.0)] = None
    seed: int | None = None
    stream: bool = False
    n: Annotated[int, Field(ge=1, le=1)] = 1
    stop: Annotated[list[str], Field(max_length=0)] | None = None
    logprobs: Literal[False] | None = None


class CompletionRequest(_Request):
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[int], Field(min_length=1)]
    """Text (encoded with the byte tokenizer, BOS first) or token ids as given."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str


class ChatRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int | None, Field(ge=1, le=MAX_TOKENS_LIMIT)] = None


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1)]
    identity: ValidIdentity
    kind: SnapshotKind = SnapshotKind.FULL
    cache_policy: KvCachePolicy | None = None
    """Applied between the same two tokens as the swap (None: the cache is kept)."""


class StageRequest(BaseModel):
    """A load prepared beside serving and held for a timed switch (coordinated switch)."""

    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1)]
    identity: ValidIdentity
    kind: SnapshotKind = SnapshotKind.FULL


class SwitchRequest(BaseModel):
    """Swap in the staged load of ``identity`` at the wall-clock instant ``at``."""

    model_config = ConfigDict(extra="forbid")

    identity: ValidIdentity
    at: float | None = None
    """Unix seconds; None or past: at once."""
    cache_policy: KvCachePolicy | None = None


class DeltaRequest(BaseModel):
    """A verified delta (an Incremental snapshot directory) of the served snapshot."""

    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1)]
    identity: ValidIdentity
    cache_policy: KvCachePolicy | None = None
    """Applied between the same two tokens as the patch (None: the cache is kept)."""


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: PauseMode = PauseMode.IN_PLACE


class ResetCacheRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: KvCachePolicy


class LogitsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: Annotated[
        list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=4096)
    ]


class SwapDelayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(ge=0.0, le=600.0)
