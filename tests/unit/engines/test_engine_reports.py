"""What SGLang and vLLM say they serve (``Engine.report``), and the restart signals.

Issue item 7: before any update both engines report ``"default"`` (not none), and after a
restart their launch value again; vLLM's dev-mode ``/server_info`` names its instance.
Answers are the released handlers' (checked by :func:`answer`), requests the released
routes' (:class:`ReleasedRecorder`).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from hotload.engines import SGLangEngine, VLLMEngine, vllm_adapter
from hotload.engines.protocol import EngineReport
from tests.unit.engines.released import SGLANG, VLLM, ReleasedRecorder, answer

SGLANG_URL = "http://10.0.0.1:30000"
VLLM_URL = "http://10.0.0.2:8000"


def model_info(version: str, path: str) -> httpx.Response:
    payload = {"model_path": path, "served_model_name": path, "weight_version": version}
    return answer(SGLANG, "GET", "/model_info", payload)


def weight_info(version: str) -> httpx.Response:
    return answer(VLLM, "GET", "/weight_info", {"weight_version": version})


def server_info(instance: str) -> httpx.Response:
    payload = {"vllm_config": {"instance_id": instance}, "vllm_env": {}, "system_env": {}}
    return answer(VLLM, "GET", "/server_info", payload)


async def test_sglang_reports_nothing_loaded_at_launch_then_the_version_then_a_restart() -> None:
    recorder = ReleasedRecorder(
        {
            ("GET", "/model_info"): [
                model_info("default", "/models/base"),
                model_info("step-4", "/var/lib/hotload/staging/a/step-4"),
                model_info("default", "/models/base"),  # the process restarted
            ]
        },
        contract=SGLANG,
    )
    sglang = SGLangEngine(SGLANG_URL, recorder.client())
    base, step = "/models/base", "/var/lib/hotload/staging/a/step-4"
    assert await sglang.report() == EngineReport(None, None, None, generation=base)
    assert await sglang.report() == EngineReport("step-4", None, None, generation=step)
    assert await sglang.report() == EngineReport(None, None, None, generation=base)


async def test_sglang_names_a_foreign_disk_update_by_its_path_and_a_pause_by_ready() -> None:
    """Issue 22, findings 6 and 9: someone else's ``/update_weights_from_disk`` naming the
    served version changes only ``model_path``; a pause shows as ``/ready`` 503 while
    ``/model_info`` answers (``http_server.py:714-718``)."""
    ours, theirs = "/var/lib/hotload/staging/buffers/a/step-4", "/tmp/other-weights"
    recorder = ReleasedRecorder(
        {
            ("GET", "/model_info"): [model_info("step-4", ours), model_info("step-4", theirs)],
            ("GET", "/ready"): [httpx.Response(200, json={}), httpx.Response(503, json={})],
        },
        contract=SGLANG,
    )
    sglang = SGLangEngine(SGLANG_URL, recorder.client())
    before, after = await sglang.report(), await sglang.report()
    assert (before.identity, before.generation, before.paused) == ("step-4", ours, False)
    assert (after.identity, after.generation, after.paused) == ("step-4", theirs, True)


async def test_vllm_says_whether_it_is_paused_and_offers_no_generation() -> None:
    recorder = ReleasedRecorder(
        {
            ("GET", "/weight_info"): weight_info("step-4"),
            ("GET", "/server_info"): server_info("100"),
            ("GET", "/is_paused"): [
                answer(VLLM, "GET", "/is_paused", {"is_paused": False}),
                answer(VLLM, "GET", "/is_paused", {"is_paused": True}),
            ],
        },
        contract=VLLM,
    )
    vllm = VLLMEngine(VLLM_URL, recorder.client())
    reports = [await vllm.report(), await vllm.report()]
    assert [r.paused for r in reports] == [False, True]
    assert [r.generation for r in reports] == [None, None]


async def test_vllm_reports_a_restart_when_a_new_instance_is_back_on_the_launch_version() -> None:
    recorder = ReleasedRecorder(
        {
            ("GET", "/weight_info"): [
                weight_info("default"),
                weight_info("step-4"),
                weight_info("default"),  # restarted: a new id and the launch version
            ],
            ("GET", "/server_info"): [server_info("100"), server_info("100"), server_info("200")],
        },
        contract=VLLM,
    )
    vllm = VLLMEngine(VLLM_URL, recorder.client())
    assert await vllm.report() == EngineReport(None, "100", None)
    assert await vllm.report() == EngineReport("step-4", "100", None)
    assert await vllm.report() == EngineReport(None, "200", None)


async def test_vllm_with_several_api_servers_is_one_engine_not_a_restart_per_report() -> None:
    """``--api-server-count 2``: each API-server process has its own instance id and the
    reports alternate between them; the version still names what was loaded."""
    recorder = ReleasedRecorder(
        {
            ("GET", "/weight_info"): weight_info("step-4"),
            ("GET", "/server_info"): [server_info("100"), server_info("101"), server_info("100")],
            ("GET", "/v1/models"): answer(
                VLLM, "GET", "/v1/models", {"object": "list", "data": []}
            ),
        },
        contract=VLLM,
    )
    vllm = VLLMEngine(VLLM_URL, recorder.client())
    reports = [await vllm.report() for _ in range(3)]
    assert {report.instance_id for report in reports} == {"100"}


async def test_vllm_keeps_its_instance_id_when_server_info_is_slow() -> None:
    """The first ``/server_info`` runs collect_env (seconds): a report must not fail whole
    once the id of this start is known (a snapshot loaded: no restart since)."""
    slow = httpx.Response(503, json={})
    recorder = ReleasedRecorder(
        {
            ("GET", "/weight_info"): weight_info("s-1"),
            ("GET", "/server_info"): [server_info("100"), slow],
        },
        contract=VLLM,
    )
    vllm = VLLMEngine(VLLM_URL, recorder.client())
    assert (await vllm.report()).instance_id == "100"
    assert (await vllm.report()).instance_id == "100"


async def test_vllm_reports_without_an_id_while_the_first_server_info_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 8: the first ``/server_info`` (collect_env: up to 11 s measured) timed out or
    outlasted the sidecar's report timeout, and the whole report was lost. Now the report
    comes without an id, the request goes on, and its answer serves the next report."""
    monkeypatch.setattr(vllm_adapter, "INSTANCE_WAIT_S", 0.05)
    answers = iter(["timeout", "slow", "fast"])

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info":
            return weight_info("s-1")
        if request.url.path != "/server_info":  # the adapter's probe and /v1/models
            return httpx.Response(200, json={})
        how = next(answers)
        if how == "timeout":
            raise httpx.ReadTimeout("collect_env", request=request)
        if how == "slow":
            await asyncio.sleep(0.3)
        return server_info("100")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        vllm = VLLMEngine(VLLM_URL, client)
        assert await vllm.report() == EngineReport("s-1", None, None)  # it timed out
        assert await vllm.report() == EngineReport("s-1", None, None)  # still answering
        await asyncio.sleep(0.4)
        assert (await vllm.report()).instance_id == "100"  # the slow answer, kept
        await vllm.aclose()


async def test_vllm_restarted_with_a_slow_server_info_never_keeps_the_old_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured on a busy machine: after a restart the first ``/server_info`` answered
    only once the sidecar had reloaded the snapshot; the new id then came with the version
    no longer at its launch value and was taken for another API server's, so the old id
    stood for good. Now the old id is dropped as soon as the version is back at its launch
    value and the id is not known yet; the next id that comes is the new start's."""
    monkeypatch.setattr(vllm_adapter, "INSTANCE_WAIT_S", 0.05)
    version = "s-1"
    slow = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info":
            return weight_info(version)
        if request.url.path != "/server_info":
            return httpx.Response(200, json={})
        if version == "s-1" and not slow.is_set():
            return server_info("100")
        await slow.wait()  # collect_env of the new start
        return server_info("200")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        vllm = VLLMEngine(VLLM_URL, client)
        assert (await vllm.report()).instance_id == "100"
        version = "default"  # the engine restarted
        assert await vllm.report() == EngineReport(None, None, None)
        version = "s-1"  # the sidecar reloaded the snapshot
        slow.set()
        await asyncio.sleep(0.05)
        assert (await vllm.report()).instance_id == "200"
        await vllm.aclose()


async def test_neither_reports_a_manifest_digest_even_when_asked() -> None:
    """Their checksums are of their own fused parameters; verifyDigest checks them inside
    the adapter instead (test_*_released.py)."""
    recorder = ReleasedRecorder(
        {("GET", "/weight_info"): weight_info("s"), ("GET", "/server_info"): server_info("1")},
        contract=VLLM,
    )
    report = await VLLMEngine(VLLM_URL, recorder.client(), verify_digest=True).report(digest=True)
    assert report.digest is None
