"""Choosing an adapter from the deployment's engine kind; the noop engine."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hotload.api import EngineKind, KvCachePolicy, SnapshotKind
from hotload.engines import (
    Engine,
    NoopEngine,
    PauseMode,
    ReferenceEngine,
    SGLangEngine,
    VLLMEngine,
    engine_url,
    make_engine,
)
from hotload.errors import ConfigError
from hotload.snapshot import REBUILT_NAME


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        (EngineKind.REFERENCE, ReferenceEngine),
        (EngineKind.SGLANG, SGLangEngine),
        (EngineKind.VLLM, VLLMEngine),
        (EngineKind.NOOP, NoopEngine),
    ],
)
async def test_make_engine_returns_the_adapter_of_each_kind(kind: EngineKind, cls: type) -> None:
    engine = make_engine(kind, "http://10.1.0.5:8000")
    assert isinstance(engine, cls)
    assert isinstance(engine, Engine)
    assert engine.kind is kind
    await engine.aclose()


def test_engines_other_than_noop_need_an_address() -> None:
    with pytest.raises(ConfigError):
        make_engine(EngineKind.REFERENCE, None)
    assert make_engine(EngineKind.NOOP, None).base_url is None


def test_engine_url_is_the_pod_ip_and_port() -> None:
    assert engine_url("127.101.1.7", 8000) == "http://127.101.1.7:8000"
    assert engine_url("fd00::7", 8000) == "http://[fd00::7]:8000"
    with pytest.raises(ConfigError):
        engine_url(None, 8000)


async def test_a_borrowed_client_is_not_closed_by_the_adapter() -> None:
    client = httpx.AsyncClient()
    engine = make_engine(EngineKind.SGLANG, "http://10.1.0.5:30000", client)
    await engine.aclose()
    assert not client.is_closed
    await client.aclose()


async def test_noop_accepts_every_swap_at_once_and_serves_nothing() -> None:
    engine = NoopEngine()
    await engine.wait_ready(timeout=0)
    assert await engine.health()
    assert await engine.served_identity() is None
    await engine.pause(PauseMode.IN_PLACE)
    assert engine.paused
    await engine.load_weights(Path("/nowhere/step-1"), "step-1", kind=SnapshotKind.FULL)
    await engine.load_weights(Path("/nowhere/lora"), "lora-1", kind=SnapshotKind.LORA)
    await engine.resume()
    await engine.reset_cache(KvCachePolicy.ALL)
    assert not engine.paused
    assert await engine.served_identity() == "lora-1"
    assert [identity for _, identity, _ in engine.loads] == ["step-1", "lora-1"]
    assert engine.identities_of({"hotload_identity": "x"}) == []
    assert (await engine.report(digest=True)).digest is None  # no decoder's record there


async def test_noop_reports_the_digest_the_decoder_recorded_for_what_it_was_handed(
    tmp_path: Path,
) -> None:
    """Would catch: the noop engine (the operator tests' fleet) giving the sidecar no
    digest to verify and report, or the digest of another snapshot than it was handed."""
    rebuilt = tmp_path / "step-1"
    rebuilt.mkdir()
    record = {"identity": "step-1", "step": 1, "kind": "Full", "tensorDigest": "ab" * 16}
    (rebuilt / REBUILT_NAME).write_text(json.dumps(record))
    engine = NoopEngine()
    await engine.load_weights(rebuilt, "step-1", kind=SnapshotKind.FULL)
    assert (await engine.report(digest=True)).digest == "ab" * 16
    assert (await engine.report()).digest is None  # only when asked, as engines answer
    await engine.load_weights(rebuilt, "step-2", kind=SnapshotKind.FULL)  # not its record
    assert (await engine.report(digest=True)).digest is None


@pytest.mark.parametrize(
    ("kind", "route", "key"),
    [
        (EngineKind.SGLANG, "/model_info", "weight_version"),
        (EngineKind.VLLM, "/weight_info", "weight_version"),
    ],
)
async def test_the_launch_version_of_the_spec_reaches_the_adapter(
    kind: EngineKind, route: str, key: str
) -> None:
    """``spec.engine.launchVersion`` (SGLang started with ``--weight-version base-v0``):
    that label names no snapshot; before it was plumbed, "base-v0" read as one."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == route:
            return httpx.Response(200, json={key: "base-v0"})
        return httpx.Response(404, json={"error": {"type": "Not Found"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        engine = make_engine(kind, "http://10.1.0.5:8000", client, launch_version="base-v0")
        assert await engine.served_identity() is None  # type: ignore[attr-defined]
        other = make_engine(kind, "http://10.1.0.5:8000", client)
        assert await other.served_identity() == "base-v0"  # type: ignore[attr-defined]


async def test_noop_reads_the_path_it_is_handed_under_its_hosts_root(tmp_path: Path) -> None:
    """Would catch: the shared runtime's noop engines (in the sidecar's process, the pod's
    volumes under a root) reading the engine container's path on the host, finding no
    record and giving no digest, so the operator never sees one to corroborate."""
    handed = Path("/var/lib/hotload/staging/buffers/a/step-1")
    rebuilt = tmp_path.joinpath(*handed.parts[1:])
    rebuilt.mkdir(parents=True)
    record = {"identity": "step-1", "step": 1, "kind": "Full", "tensorDigest": "cd" * 16}
    (rebuilt / REBUILT_NAME).write_text(json.dumps(record))
    engine = make_engine(EngineKind.NOOP, None, root=tmp_path)
    await engine.load_weights(handed, "step-1", kind=SnapshotKind.FULL)
    assert (await engine.report(digest=True)).digest == "cd" * 16
