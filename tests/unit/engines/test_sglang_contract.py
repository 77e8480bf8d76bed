"""SGLang 0.5.23: the exact requests the adapter sends, and its traps.

Every request goes through :class:`ReleasedRecorder` (the released route table and
models) and every answer is one the released handler gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, SGLangEngine
from hotload.engines.identity_fields import UNKNOWN_VERSION
from hotload.errors import EngineBusy, EngineRejected, EngineUnavailable
from tests.unit.engines.released import SGLANG, ReleasedRecorder, answer, text_answer

BASE = "http://10.0.0.1:30000"  # never contacted: the transport is a mock


def engine(recorder: ReleasedRecorder, **kwargs: object) -> SGLangEngine:
    return SGLangEngine(BASE, recorder.client(), **kwargs)  # type: ignore[arg-type]


def released(routes: dict[tuple[str, str], Any] | None = None) -> ReleasedRecorder:
    return ReleasedRecorder(routes or {}, contract=SGLANG)


def update_answer(success: bool, message: str) -> httpx.Response:
    payload = {"success": success, "message": message, "num_paused_requests": 0}
    return answer(SGLANG, "POST", "/update_weights_from_disk", payload, 200 if success else 400)


def lora_answer(success: bool, error: str | None = None) -> httpx.Response:
    payload = SGLANG.example("LoRAUpdateOutput", success=success, error_message=error)
    return answer(SGLANG, "POST", "/load_lora_adapter", payload, 200 if success else 400)


def version_answer(identity: str) -> httpx.Response:
    payload = {"success": True, "message": "updated", "new_version": identity}
    return answer(SGLANG, "POST", "/update_weight_version", payload)


def control_answer() -> httpx.Response:
    return answer(SGLANG, "POST", "/pause_generation", {"message": "ok", "status": "ok"})


def model_info(version: str) -> httpx.Response:
    payload = {"model_path": "/m", "served_model_name": "m", "weight_version": version}
    return answer(SGLANG, "GET", "/model_info", payload)


async def test_full_load_sends_update_weights_from_disk_without_flushing() -> None:
    recorder = released({("POST", "/update_weights_from_disk"): update_answer(True, "ok")})
    await engine(recorder).load_weights(Path("/staging/step-7"), "step-7", kind=SnapshotKind.FULL)
    assert recorder.calls() == [
        (
            "POST",
            "/update_weights_from_disk",
            {},
            {
                "model_path": "/staging/step-7",
                "weight_version": "step-7",
                "flush_cache": False,
                "abort_all_requests": False,
            },
        )
    ]


async def test_success_false_is_rejected_even_when_the_weights_changed() -> None:
    """0.5.23 updates the version /model_info reports only on success, and a failed update
    may have changed the weights (flush refused after the load, or a rollback that re-read
    the new path): a refusal never counts as loaded; the weights are unknown."""
    recorder = released(
        {
            ("POST", "/update_weights_from_disk"): update_answer(
                False, "Weights were updated, but the cache was not flushed because requests"
            ),
            ("POST", "/update_weight_version"): version_answer(UNKNOWN_VERSION),
        }
    )
    sglang = engine(recorder)
    with pytest.raises(EngineRejected, match="cache was not flushed"):
        await sglang.load_weights(Path("/staging/step-8"), "step-8", kind=SnapshotKind.FULL)
    assert sglang.rollback_trusted is False
    # ...and the engine no longer names the old weights (0.5.23 would keep their label).
    assert recorder.calls()[1:] == [
        (
            "POST",
            "/update_weight_version",
            {},
            {"new_version": UNKNOWN_VERSION, "abort_all_requests": False},
        )
    ]


async def test_success_false_is_rejected_with_sglangs_message() -> None:
    recorder = released(
        {("POST", "/update_weights_from_disk"): update_answer(False, "shape mismatch in q_proj")}
    )
    with pytest.raises(EngineRejected) as raised:
        await engine(recorder).load_weights(
            Path("/staging/step-8"), "step-8", kind=SnapshotKind.FULL
        )
    assert "shape mismatch in q_proj" in str(raised.value)
    assert raised.value.context["identity"] == "step-8"


async def test_lora_loads_the_adapter_unloads_the_previous_and_names_the_version() -> None:
    recorder = released(
        {
            ("POST", "/load_lora_adapter"): lora_answer(True),
            ("POST", "/unload_lora_adapter"): lora_answer(True),
            ("POST", "/update_weight_version"): lambda request: version_answer("x"),
        }
    )
    sglang = engine(recorder)
    await sglang.load_weights(Path("/staging/lora-1"), "lora-1", kind=SnapshotKind.LORA)
    await sglang.load_weights(Path("/staging/lora-2"), "lora-2", kind=SnapshotKind.LORA)
    assert recorder.calls() == [
        (
            "POST",
            "/load_lora_adapter",
            {},
            {"lora_name": "lora-1", "lora_path": "/staging/lora-1", "pinned": False},
        ),
        (
            "POST",
            "/update_weight_version",
            {},
            {"new_version": "lora-1", "abort_all_requests": False},
        ),
        (
            "POST",
            "/load_lora_adapter",
            {},
            {"lora_name": "lora-2", "lora_path": "/staging/lora-2", "pinned": False},
        ),
        (
            "POST",
            "/update_weight_version",
            {},
            {"new_version": "lora-2", "abort_all_requests": False},
        ),
        ("POST", "/unload_lora_adapter", {}, {"lora_name": "lora-1"}),
    ]
    assert sglang.prepare_request("/v1/chat/completions", {"model": "m"}) == {
        "model": "m",
        "lora_path": "lora-2",
    }
    assert sglang.prepare_request("/v1/models", {}) == {}


async def test_full_load_after_a_lora_drops_the_adapter() -> None:
    recorder = released(
        {
            ("POST", "/load_lora_adapter"): lora_answer(True),
            ("POST", "/update_weight_version"): version_answer("lora-1"),
            ("POST", "/update_weights_from_disk"): update_answer(True, "ok"),
            ("POST", "/unload_lora_adapter"): lora_answer(True),
        }
    )
    sglang = engine(recorder)
    await sglang.load_weights(Path("/s/lora-1"), "lora-1", kind=SnapshotKind.LORA)
    await sglang.load_weights(Path("/s/step-9"), "step-9", kind=SnapshotKind.FULL)
    assert recorder.calls()[-1] == ("POST", "/unload_lora_adapter", {}, {"lora_name": "lora-1"})
    assert sglang.active_lora is None
    assert "lora_path" not in sglang.prepare_request("/v1/completions", {"prompt": "x"})


async def test_a_full_after_a_lora_is_loaded_even_when_the_unload_times_out() -> None:
    """The unload waits for the adapter's requests (0.5.23); its failure costs memory
    only: the load succeeded and is reported so, never as a failure of unknown outcome."""

    def hangs(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    recorder = released(
        {
            ("POST", "/load_lora_adapter"): lora_answer(True),
            ("POST", "/update_weight_version"): version_answer("lora-1"),
            ("POST", "/update_weights_from_disk"): update_answer(True, "ok"),
            ("POST", "/unload_lora_adapter"): hangs,
        }
    )
    sglang = engine(recorder)
    await sglang.load_weights(Path("/s/lora-1"), "lora-1", kind=SnapshotKind.LORA)
    await sglang.load_weights(Path("/s/step-9"), "step-9", kind=SnapshotKind.FULL)
    assert sglang.active_lora is None
    assert recorder.calls()[-1][1] == "/unload_lora_adapter"


async def test_a_restarted_adapter_routes_to_the_lora_the_engine_serves() -> None:
    """A new adapter (a restarted sidecar) reads the served adapter back from /v1/models,
    and the model name SGLang serves under from /model_info: without it the base
    weights would answer under the LoRA's name."""
    info = {"model_path": "/s/step-9", "served_model_name": "/s/step-9", "weight_version": "l-2"}
    base = SGLANG.example("ModelCard", id="/s/step-9", root="/s/step-9")
    adapter = SGLANG.example("ModelCard", id="l-2", root="/s/l-2", parent="/s/step-9")
    recorder = released(
        {
            ("GET", "/model_info"): answer(SGLANG, "GET", "/model_info", info),
            ("GET", "/v1/models"): httpx.Response(
                200, json=SGLANG.example("ModelList", data=[base, adapter])
            ),
        }
    )
    sglang = engine(recorder)
    assert (await sglang.report()).identity == "l-2"
    assert sglang.prepare_request("/v1/completions", {"model": "qwen"}) == {
        "model": "/s/step-9",
        "lora_path": "l-2",
    }
    await sglang.report()
    assert [path for _, path, _, _ in recorder.calls()].count("/v1/models") == 1


async def test_refused_lora_is_rejected() -> None:
    recorder = released({("POST", "/load_lora_adapter"): lora_answer(False, "no lora")})
    with pytest.raises(EngineRejected, match="no lora"):
        await engine(recorder).load_weights(Path("/s/l"), "l", kind=SnapshotKind.LORA)


async def test_pause_in_place_and_continue() -> None:
    recorder = released(
        {
            ("POST", "/pause_generation"): control_answer(),
            ("POST", "/continue_generation"): control_answer(),
        }
    )
    sglang = engine(recorder)
    await sglang.pause(PauseMode.IN_PLACE)
    await sglang.pause(PauseMode.WAIT)  # nothing to send: an unpaused update already waits
    await sglang.resume()
    assert recorder.calls() == [
        ("POST", "/pause_generation", {}, {"mode": "in_place"}),
        ("POST", "/continue_generation", {}, {}),
    ]


async def test_cache_policy_all_flushes_with_a_timeout_and_the_others_keep() -> None:
    recorder = released({("POST", "/flush_cache"): text_answer("Cache flushed.\n")})
    sglang = engine(recorder, flush_timeout=12.5)
    await sglang.reset_cache(KvCachePolicy.NONE)
    await sglang.reset_cache(KvCachePolicy.NEW_SESSION)
    await sglang.reset_cache(KvCachePolicy.ALL)
    assert recorder.calls() == [("POST", "/flush_cache", {"timeout": ["12.5"]}, None)]


async def test_refused_flush_is_engine_busy() -> None:
    recorder = released({("POST", "/flush_cache"): text_answer("Flush cache failed.\n", 400)})
    with pytest.raises(EngineBusy):
        await engine(recorder).reset_cache(KvCachePolicy.ALL)


async def test_served_identity_reads_model_info() -> None:
    recorder = released({("GET", "/model_info"): model_info("step-3")})
    assert await engine(recorder).served_identity() == "step-3"


def test_identities_of_native_generate_answers_come_from_meta_info() -> None:
    sglang = SGLangEngine(BASE)
    changed = {
        "meta_info": {
            "weight_version": "b",
            "weight_versions": [
                {"version": "a", "start": 0, "end": 5},
                {"version": "b", "start": 5, "end": 9},
            ],
        }
    }
    assert sglang.identities_of(changed) == ["a", "b"]
    assert sglang.identities_of({"meta_info": {"weight_version": "a"}}) == ["a"]
    assert sglang.identities_of({"choices": [{"text": "x"}]}) == []


async def test_admin_key_is_sent_as_a_bearer_token() -> None:
    recorder = released({("POST", "/continue_generation"): control_answer()})
    recorder.admin_api_key = "admin-key-1"
    await engine(recorder, admin_api_key="admin-key-1").resume()
    assert recorder.sent[0].headers["authorization"] == "Bearer admin-key-1"


async def test_unreachable_engine_is_unavailable_and_unhealthy() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    sglang = SGLangEngine(BASE, client)
    assert await sglang.health() is False
    with pytest.raises(EngineUnavailable):
        await sglang.load_weights(Path("/s"), "x", kind=SnapshotKind.FULL)
    with pytest.raises(EngineUnavailable):
        await sglang.wait_ready(timeout=0.3)
