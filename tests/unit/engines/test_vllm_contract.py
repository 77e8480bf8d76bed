"""vLLM 0.33.0: the exact requests the adapter sends, and its traps (engine-facts.md)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, VLLMEngine
from hotload.errors import EngineBusy, EngineRejected
from tests.unit.engines.recorder import Recorder, ok

BASE = "http://10.0.0.2:8000"  # never contacted: the transport is a mock


def engine(recorder: Recorder, **kwargs: object) -> VLLMEngine:
    return VLLMEngine(BASE, recorder.client(), **kwargs)  # type: ignore[arg-type]


def loaded_routes() -> dict[tuple[str, str], object]:
    return {
        ("POST", "/collective_rpc"): ok({"results": [None]}),
        ("POST", "/update_weight_version"): ok({"status": "ok"}),
    }


async def test_full_load_reloads_weights_by_collective_rpc_then_sets_the_version() -> None:
    recorder = Recorder(loaded_routes())  # type: ignore[arg-type]
    await engine(recorder).load_weights(Path("/staging/step-2"), "step-2", kind=SnapshotKind.FULL)
    assert recorder.calls() == [
        (
            "POST",
            "/collective_rpc",
            {},
            {
                "method": "reload_weights",
                "kwargs": {"weights_path": "/staging/step-2", "is_checkpoint_format": True},
            },
        ),
        ("POST", "/update_weight_version", {}, {"new_version": "step-2"}),
    ]


async def test_reloading_the_same_directory_is_refused_before_any_request() -> None:
    recorder = Recorder(loaded_routes())  # type: ignore[arg-type]
    vllm = engine(recorder)
    await vllm.load_weights(Path("/staging/a"), "step-1", kind=SnapshotKind.FULL)
    sent = len(recorder.sent)
    with pytest.raises(EngineRejected, match="new directory"):
        await vllm.load_weights(Path("/staging/a"), "step-2", kind=SnapshotKind.INCREMENTAL)
    assert len(recorder.sent) == sent
    await vllm.load_weights(Path("/staging/b"), "step-2", kind=SnapshotKind.INCREMENTAL)


async def test_missing_dev_mode_routes_are_reported_with_the_flag_to_set() -> None:
    recorder = Recorder({})
    with pytest.raises(EngineRejected, match="VLLM_SERVER_DEV_MODE=1"):
        await engine(recorder).load_weights(Path("/s/x"), "x", kind=SnapshotKind.FULL)
    with pytest.raises(EngineRejected, match="VLLM_SERVER_DEV_MODE=1"):
        await engine(recorder).pause(PauseMode.IN_PLACE)


async def test_failed_reload_is_rejected_and_the_version_is_left_alone() -> None:
    recorder = Recorder(
        {("POST", "/collective_rpc"): httpx.Response(500, json={"detail": "size mismatch"})}
    )
    with pytest.raises(EngineRejected, match="size mismatch"):
        await engine(recorder).load_weights(Path("/s/x"), "x", kind=SnapshotKind.FULL)
    assert [path for _, path, _, _ in recorder.calls()] == ["/collective_rpc"]


async def test_pause_modes_are_query_parameters() -> None:
    recorder = Recorder(
        {
            ("POST", "/pause"): ok({"status": "paused"}),
            ("POST", "/resume"): ok({"status": "resumed"}),
        }
    )
    vllm = engine(recorder)
    await vllm.pause(PauseMode.IN_PLACE)
    await vllm.pause(PauseMode.WAIT)
    await vllm.resume()
    assert recorder.calls() == [
        ("POST", "/pause", {"mode": ["keep"]}, None),
        ("POST", "/pause", {"mode": ["wait"]}, None),
        ("POST", "/resume", {}, None),
    ]


async def test_prefix_cache_reset_is_retried_while_blocks_are_held() -> None:
    recorder = Recorder(
        {
            ("POST", "/reset_prefix_cache"): [
                ok({"success": False}),
                ok({"success": False}),
                ok({"success": True}),
            ]
        }
    )
    await engine(recorder, flush_retry_interval=0.01).reset_cache(KvCachePolicy.ALL)
    assert recorder.calls() == [("POST", "/reset_prefix_cache", {}, None)] * 3


async def test_prefix_cache_reset_refused_until_the_deadline_is_engine_busy() -> None:
    recorder = Recorder({("POST", "/reset_prefix_cache"): ok({"success": False})})
    with pytest.raises(EngineBusy):
        await engine(recorder, flush_timeout=0.1, flush_retry_interval=0.02).reset_cache(
            KvCachePolicy.ALL
        )
    assert len(recorder.sent) >= 2


async def test_keep_policies_send_nothing() -> None:
    recorder = Recorder({})
    vllm = engine(recorder)
    await vllm.reset_cache(KvCachePolicy.NONE)
    await vllm.reset_cache(KvCachePolicy.NEW_SESSION)
    assert recorder.sent == []


async def test_lora_endpoints_and_requests_routed_to_the_adapter() -> None:
    recorder = Recorder(
        {
            ("POST", "/v1/load_lora_adapter"): httpx.Response(
                200, text="Success: LoRA adapter 'x' added"
            ),
            ("POST", "/v1/unload_lora_adapter"): httpx.Response(200, text="Success"),
            **loaded_routes(),  # type: ignore[dict-item]
        }
    )
    vllm = engine(recorder)
    await vllm.load_weights(Path("/s/lora-a"), "lora-a", kind=SnapshotKind.LORA)
    await vllm.load_weights(Path("/s/lora-b"), "lora-b", kind=SnapshotKind.LORA)
    assert recorder.calls() == [
        (
            "POST",
            "/v1/load_lora_adapter",
            {},
            {"lora_name": "lora-a", "lora_path": "/s/lora-a", "load_inplace": False},
        ),
        ("POST", "/update_weight_version", {}, {"new_version": "lora-a"}),
        (
            "POST",
            "/v1/load_lora_adapter",
            {},
            {"lora_name": "lora-b", "lora_path": "/s/lora-b", "load_inplace": False},
        ),
        ("POST", "/v1/unload_lora_adapter", {}, {"lora_name": "lora-a"}),
        ("POST", "/update_weight_version", {}, {"new_version": "lora-b"}),
    ]
    assert vllm.prepare_request("/v1/completions", {"model": "base", "prompt": "p"}) == {
        "model": "lora-b",
        "prompt": "p",
        "return_weight_versions": True,
    }


async def test_lora_without_runtime_updating_is_rejected_with_the_flag_to_set() -> None:
    with pytest.raises(EngineRejected, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
        await engine(Recorder({})).load_weights(Path("/s/l"), "l", kind=SnapshotKind.LORA)


def test_generation_requests_ask_for_weight_versions() -> None:
    vllm = VLLMEngine(BASE)
    assert vllm.prepare_request("/v1/chat/completions", {"messages": []}) == {
        "messages": [],
        "return_weight_versions": True,
    }
    assert vllm.prepare_request("/v1/models", {}) == {}


def test_identities_come_from_each_choice() -> None:
    vllm = VLLMEngine(BASE)
    chunk = {
        "choices": [{"index": 0, "text": "x", "weight_versions": ["step-1", "step-1", "step-2"]}]
    }
    assert vllm.identities_of(chunk) == ["step-1", "step-2"]
    assert vllm.identities_of({"choices": [{"index": 0, "text": "x"}]}) == []


async def test_served_identity_reads_weight_info() -> None:
    recorder = Recorder({("GET", "/weight_info"): ok({"weight_version": "step-4"})})
    assert await engine(recorder).served_identity() == "step-4"
