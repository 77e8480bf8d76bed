"""``make_engine``: the adapter for a RolloutDeployment's ``spec.engine.kind``."""

from __future__ import annotations

from pathlib import Path

import httpx

from hotload.api import EngineKind
from hotload.engines.noop_engine import NoopEngine
from hotload.engines.protocol import Engine
from hotload.engines.reference_adapter import ReferenceEngine
from hotload.engines.sglang_adapter import DEFAULT_LOAD_TIMEOUT as SGLANG_LOAD_TIMEOUT
from hotload.engines.sglang_adapter import LAUNCH_VERSION as SGLANG_LAUNCH_VERSION
from hotload.engines.sglang_adapter import SGLangEngine
from hotload.engines.vllm_adapter import DEFAULT_LOAD_TIMEOUT as VLLM_LOAD_TIMEOUT
from hotload.engines.vllm_adapter import LAUNCH_VERSION as VLLM_LAUNCH_VERSION
from hotload.engines.vllm_adapter import VLLMEngine
from hotload.errors import ConfigError


def engine_url(pod_ip: str | None, port: int) -> str:
    """``http://<pod-ip>:<port>`` — the sidecar reaches its engine on the pod's IP (never
    127.0.0.1: locally all pods share one host)."""
    if not pod_ip:
        raise ConfigError("the engine is reached on the pod IP; POD_IP is not set", port=port)
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}"


def make_engine(
    kind: EngineKind,
    base_url: str | None,
    http_client: httpx.AsyncClient | None = None,
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    load_timeout: float | None = None,
    verify_digest: bool = False,
    launch_version: str | None = None,
    root: Path | None = None,
) -> Engine:
    """The adapter for ``kind`` talking to ``base_url`` (ignored for ``noop``).

    ``http_client`` is borrowed (the caller closes it); without one the adapter owns a
    client of its own. ``api_key`` is the engine's ``--api-key``, sent as a bearer token;
    ``admin_api_key`` SGLang's ``--admin-api-key`` (its admin routes take only that one
    when it is set). ``verify_digest`` (``spec.engine.verifyDigest``): SGLang and vLLM
    report their own checksum of the loaded weights when asked for a digest.
    ``launch_version`` (``spec.engine.launchVersion``): the version SGLang or vLLM reports
    before any load, which names no snapshot (None: their default, ``"default"``).
    ``root``: where mount paths lie on this host (the noop engine reads the directory it
    is handed; other engines run in their own container).
    """
    if kind is EngineKind.NOOP:
        return NoopEngine(root)
    if not base_url:
        raise ConfigError("an engine other than noop needs a base URL", engine=kind.value)
    timeouts: dict[str, float] = {} if load_timeout is None else {"load_timeout": load_timeout}
    if kind is EngineKind.REFERENCE:
        return ReferenceEngine(base_url, http_client, api_key=api_key, **timeouts)
    if kind is EngineKind.SGLANG:
        return SGLangEngine(
            base_url,
            http_client,
            api_key=api_key,
            admin_api_key=admin_api_key,
            load_timeout=load_timeout if load_timeout is not None else SGLANG_LOAD_TIMEOUT,
            verify_digest=verify_digest,
            launch_version=launch_version or SGLANG_LAUNCH_VERSION,
        )
    if kind is EngineKind.VLLM:
        return VLLMEngine(
            base_url,
            http_client,
            api_key=api_key,
            load_timeout=load_timeout if load_timeout is not None else VLLM_LOAD_TIMEOUT,
            verify_digest=verify_digest,
            launch_version=launch_version or VLLM_LAUNCH_VERSION,
        )
    raise ConfigError("unknown engine kind", engine=str(kind))
