"""vLLM 0.33.0: the exact requests the adapter sends, and its traps.

Every request goes through :class:`ReleasedRecorder` (the released route table and
models) and every answer is one the released handler gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, VLLMEngine
from hotload.engines.vllm_adapter import UNKNOWN_VERSION
from hotload.errors import EngineBusy, EngineRejected, LoadNotStarted
from tests.unit.engines.released import VLLM, ReleasedRecorder, answer, text_answer, vllm_error

#: Every directory handed to the adapter exists, with complete weights (conftest.py).
pytestmark = pytest.mark.usefixtures("checkpoints")

BASE = "http://10.0.0.2:8000"  # never contacted: the transport is a mock


def engine(recorder: ReleasedRecorder, **kwargs: object) -> VLLMEngine:
    return VLLMEngine(BASE, recorder.client(), **kwargs)  # type: ignore[arg-type]


def released(routes: dict[tuple[str, str], Any] | None = None) -> ReleasedRecorder:
    return ReleasedRecorder(routes or {}, contract=VLLM)


def version_set(identity: str) -> httpx.Response:
    payload = {"success": True, "new_version": identity}
    return answer(VLLM, "POST", "/update_weight_version", payload)


def loaded_routes() -> dict[tuple[str, str], Any]:
    return {
        ("POST", "/collective_rpc"): answer(VLLM, "POST", "/collective_rpc", {"results": [None]}),
        ("POST", "/update_weight_version"): lambda request: version_set(
            json.loads(request.content)["new_version"]
        ),
    }


NOT_REGISTERED = vllm_error("Not Found", "Not Found", 404)


async def test_full_load_reloads_weights_by_collective_rpc_then_sets_the_version() -> None:
    recorder = released(loaded_routes())
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


async def test_a_directory_reloaded_with_other_weights_is_refused_before_any_request() -> None:
    recorder = released(loaded_routes())
    vllm = engine(recorder)
    await vllm.load_weights(Path("/staging/a"), "step-1", kind=SnapshotKind.FULL)
    sent = len(recorder.sent)
    with pytest.raises(EngineRejected, match="its own directory"):
        await vllm.load_weights(Path("/staging/a"), "step-2", kind=SnapshotKind.INCREMENTAL)
    assert len(recorder.sent) == sent
    await vllm.load_weights(Path("/staging/b"), "step-2", kind=SnapshotKind.INCREMENTAL)


async def test_the_served_snapshot_may_be_reloaded_from_its_directory() -> None:
    """After a failed load (no rollback) the sidecar reloads what it served from staging."""
    recorder = released(loaded_routes())
    vllm = engine(recorder)
    await vllm.load_weights(Path("/staging/a"), "step-1", kind=SnapshotKind.FULL)
    await vllm.load_weights(Path("/staging/a"), "step-1", kind=SnapshotKind.FULL)
    assert [path for _, path, _, _ in recorder.calls()].count("/collective_rpc") == 2


async def test_missing_dev_mode_routes_are_reported_with_the_flag_to_set() -> None:
    recorder = released(
        {("POST", "/collective_rpc"): NOT_REGISTERED, ("POST", "/pause"): NOT_REGISTERED}
    )
    with pytest.raises(EngineRejected, match="VLLM_SERVER_DEV_MODE=1"):
        await engine(recorder).load_weights(Path("/s/x"), "x", kind=SnapshotKind.FULL)
    with pytest.raises(EngineRejected, match="VLLM_SERVER_DEV_MODE=1"):
        await engine(recorder).pause(PauseMode.IN_PLACE)


async def test_a_failed_reload_is_rejected_and_the_engine_labelled_unknown() -> None:
    """The weights are unknown after it: the engine's own label must not keep naming the
    snapshot it served before (its responses would carry it)."""
    recorder = released(
        {
            ("POST", "/collective_rpc"): vllm_error("size mismatch", "InternalServerError", 500),
            ("POST", "/update_weight_version"): answer(
                VLLM, "POST", "/update_weight_version", {"success": True, "new_version": "u"}
            ),
        }
    )
    with pytest.raises(EngineRejected, match="size mismatch"):
        await engine(recorder).load_weights(Path("/s/x"), "x", kind=SnapshotKind.FULL)
    assert [(path, body) for _, path, _, body in recorder.calls()][1:] == [
        ("/update_weight_version", {"new_version": UNKNOWN_VERSION})
    ]


async def test_a_directory_that_would_kill_vllm_is_refused_before_any_request(
    checkpoints: Path,
) -> None:
    """Missing, a corrupt header, a truncated file: vLLM would be left without weights."""
    recorder = released({})
    vllm = engine(recorder)
    with pytest.raises(LoadNotStarted, match="does not exist"):
        await vllm.load_weights(Path("/s/missing"), "m", kind=SnapshotKind.FULL)
    weights = checkpoints / "s" / "x" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-3])
    with pytest.raises(LoadNotStarted, match="truncated"):
        await vllm.load_weights(Path("/s/x"), "x", kind=SnapshotKind.FULL)
    weights.write_bytes(b"\xff" * 16)
    with pytest.raises(LoadNotStarted, match="header"):
        await vllm.load_weights(Path("/s/x"), "x", kind=SnapshotKind.FULL)
    assert recorder.calls() == []


async def test_pause_modes_are_query_parameters() -> None:
    recorder = released(
        {
            ("POST", "/pause"): answer(VLLM, "POST", "/pause", {"status": "paused"}),
            ("POST", "/resume"): answer(VLLM, "POST", "/resume", {"status": "resumed"}),
        }
    )
    vllm = engine(recorder)
    await vllm.pause(PauseMode.IN_PLACE)
    await vllm.resume()
    assert recorder.calls() == [
        ("POST", "/pause", {"mode": ["keep"], "clear_cache": ["false"]}, None),
        ("POST", "/resume", {}, None),
    ]


async def test_wait_never_sends_mode_wait() -> None:
    """0.33.0 answers new requests 503 while paused in ``wait`` (0.32.0 held them)."""
    recorder = released({("POST", "/pause"): answer(VLLM, "POST", "/pause", {"status": "paused"})})
    await engine(recorder).pause(PauseMode.WAIT)
    assert recorder.calls() == [
        ("POST", "/pause", {"mode": ["keep"], "clear_cache": ["false"]}, None),
    ]


async def test_prefix_cache_reset_is_retried_while_blocks_are_held() -> None:
    def reset(success: bool) -> httpx.Response:
        return answer(VLLM, "POST", "/reset_prefix_cache", {"success": success})

    recorder = released(
        {("POST", "/reset_prefix_cache"): [reset(False), reset(False), reset(True)]}
    )
    await engine(recorder, flush_retry_interval=0.01).reset_cache(KvCachePolicy.ALL)
    assert recorder.calls() == [("POST", "/reset_prefix_cache", {}, None)] * 3


async def test_prefix_cache_reset_refused_until_the_deadline_is_engine_busy() -> None:
    refused = answer(VLLM, "POST", "/reset_prefix_cache", {"success": False})
    recorder = released({("POST", "/reset_prefix_cache"): refused})
    with pytest.raises(EngineBusy):
        await engine(recorder, flush_timeout=0.1, flush_retry_interval=0.02).reset_cache(
            KvCachePolicy.ALL
        )
    assert len(recorder.sent) >= 2


async def test_keep_policies_send_nothing() -> None:
    recorder = released()
    vllm = engine(recorder)
    await vllm.reset_cache(KvCachePolicy.NONE)
    await vllm.reset_cache(KvCachePolicy.NEW_SESSION)
    assert recorder.sent == []


async def test_lora_endpoints_and_requests_routed_to_the_adapter() -> None:
    recorder = released(
        {
            ("POST", "/v1/load_lora_adapter"): text_answer("Success: LoRA adapter 'x' added"),
            ("POST", "/v1/unload_lora_adapter"): text_answer("Success: LoRA adapter removed"),
            **loaded_routes(),
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
        ("POST", "/update_weight_version", {}, {"new_version": "lora-b"}),
        ("POST", "/v1/unload_lora_adapter", {}, {"lora_name": "lora-a"}),
    ]
    assert vllm.prepare_request("/v1/completions", {"model": "base", "prompt": "p"}) == {
        "model": "lora-b",
        "prompt": "p",
    }


async def test_lora_without_runtime_updating_is_rejected_with_the_flag_to_set() -> None:
    with pytest.raises(EngineRejected, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
        await engine(released({("POST", "/v1/load_lora_adapter"): NOT_REGISTERED})).load_weights(
            Path("/s/l"), "l", kind=SnapshotKind.LORA
        )


async def test_generation_requests_ask_for_weight_versions_where_the_server_offers_them() -> None:
    """Probed from the server's own OpenAPI schema: 0.33.0's CompletionRequest has the
    field (0.32.0's has not, and ignores it)."""
    recorder = released({})
    vllm = engine(recorder)
    assert vllm.prepare_request("/v1/completions", {"prompt": "x"}) == {"prompt": "x"}
    await vllm.probe()
    assert recorder.probed == ["/openapi.json"]
    assert vllm.prepare_request("/v1/chat/completions", {"messages": []}) == {
        "messages": [],
        "return_weight_versions": True,
    }
    assert vllm.prepare_request("/v1/models", {}) == {}


def test_identities_come_from_each_choice() -> None:
    vllm = VLLMEngine(BASE)
    spans = [
        {"version": "step-1", "start": 0, "end": 2},
        {"version": "step-2", "start": 2, "end": 5},
    ]
    choice = VLLM.example("CompletionResponseChoice", index=0, text="x", weight_versions=spans)
    response = VLLM.example("CompletionResponse", model="m", choices=[choice])
    assert vllm.identities_of(response) == ["step-1", "step-2"]
    plain = VLLM.example("CompletionResponseChoice", index=0, text="x")
    assert vllm.identities_of(VLLM.example("CompletionResponse", model="m", choices=[plain])) == []


async def test_served_identity_reads_weight_info() -> None:
    recorder = released(
        {("GET", "/weight_info"): answer(VLLM, "GET", "/weight_info", {"weight_version": "step-4"})}
    )
    assert await engine(recorder).served_identity() == "step-4"
