"""The reference adapter's requests and how it reads answers (the server runs for real in
tests/integration/engines; this pins the wire format both sides agree on)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, ReferenceEngine
from hotload.errors import EngineBusy, EngineRejected
from tests.unit.engines.recorder import Recorder, ok

BASE = "http://10.0.0.3:8000"


async def test_admin_requests() -> None:
    recorder = Recorder(
        {
            ("POST", "/admin/load"): ok({"identity": "step-1"}),
            ("POST", "/admin/pause"): ok(),
            ("POST", "/admin/resume"): ok(),
            ("POST", "/admin/reset_cache"): ok(),
            ("GET", "/admin/identity"): ok({"identity": "step-1"}),
        }
    )
    engine = ReferenceEngine(BASE, recorder.client())
    await engine.pause(PauseMode.IN_PLACE)
    await engine.load_weights(Path("/staging/step-1"), "step-1", kind=SnapshotKind.LORA)
    await engine.resume()
    await engine.reset_cache(KvCachePolicy.NEW_SESSION)
    assert await engine.served_identity() == "step-1"
    assert recorder.calls() == [
        ("POST", "/admin/pause", {}, {"mode": "in_place"}),
        (
            "POST",
            "/admin/load",
            {},
            {"path": "/staging/step-1", "identity": "step-1", "kind": "LoRA"},
        ),
        ("POST", "/admin/resume", {}, {}),
        ("POST", "/admin/reset_cache", {}, {"policy": "new_session"}),
        ("GET", "/admin/identity", {}, None),
    ]


@pytest.mark.parametrize(
    ("status", "error"), [(422, EngineRejected), (400, EngineRejected), (409, EngineBusy)]
)
async def test_load_refusals_map_to_typed_errors(status: int, error: type[Exception]) -> None:
    recorder = Recorder(
        {("POST", "/admin/load"): httpx.Response(status, json={"detail": "missing tensor x"})}
    )
    with pytest.raises(error, match="missing tensor x"):
        await ReferenceEngine(BASE, recorder.client()).load_weights(
            Path("/s"), "s", kind=SnapshotKind.FULL
        )


def test_identities_are_read_from_hotload_fields() -> None:
    engine = ReferenceEngine(BASE)
    assert engine.identities_of({"hotload_identity": "b", "hotload_identities": ["a", "b"]}) == [
        "a",
        "b",
    ]
    assert engine.identities_of({"hotload_identity": "a"}) == ["a"]
    assert engine.identities_of({}) == []
    assert engine.prepare_request("/v1/completions", {"prompt": "x"}) == {"prompt": "x"}


async def test_report_reads_identity_instance_and_digest() -> None:
    recorder = Recorder(
        {
            ("GET", "/admin/identity"): ok(
                {"identity": "step-1", "instance_id": "i-7", "loaded": True, "digest": "ab" * 16}
            ),
        }
    )
    engine = ReferenceEngine(BASE, recorder.client())
    report = await engine.report(digest=True)
    assert (report.identity, report.instance_id, report.digest) == ("step-1", "i-7", "ab" * 16)
    assert recorder.calls() == [("GET", "/admin/identity", {"digest": ["true"]}, None)]
    assert engine.rollback_trusted is True


async def test_launch_weights_report_no_identity() -> None:
    recorder = Recorder(
        {
            ("GET", "/admin/identity"): ok(
                {"identity": "init", "instance_id": "i-1", "loaded": False}
            )
        }
    )
    report = await ReferenceEngine(BASE, recorder.client()).report()
    assert (report.identity, report.instance_id, report.digest) == (None, "i-1", None)
