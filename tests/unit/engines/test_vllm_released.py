"""vLLM 0.33.0 as released: the adapter against the route table and models of the wheel.

One test per item of the "real engines" issue that concerns vLLM; every request is
checked by :class:`ReleasedRecorder` against the released handlers (dev-mode routes,
query parameters, embedded body fields), every scripted answer comes from the released
models or is checked against the handler's answer keys.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, VLLMEngine
from hotload.engines.engine_checksum import checksums_digest
from hotload.errors import EngineRejected
from tests.unit.engines.released import VLLM, ReleasedRecorder, answer, text_answer, vllm_error

#: Every directory handed to the adapter exists, with complete weights (conftest.py).
pytestmark = pytest.mark.usefixtures("checkpoints")

BASE = "http://10.0.0.2:8000"  # never contacted: the transport is a mock


def engine(recorder: ReleasedRecorder, **kwargs: object) -> VLLMEngine:
    return VLLMEngine(BASE, recorder.client(), **kwargs)  # type: ignore[arg-type]


def paused() -> httpx.Response:
    return answer(VLLM, "POST", "/pause", {"status": "paused"})


def resumed() -> httpx.Response:
    return answer(VLLM, "POST", "/resume", {"status": "resumed"})


# --- item 2: a failed reload leaves the weights unknown --------------------------------


async def test_a_failed_reload_is_rejected_and_never_trusted_to_have_rolled_back() -> None:
    recorder = ReleasedRecorder(
        {
            ("POST", "/collective_rpc"): vllm_error(
                "Failed to load weights: missing tensor", "InternalServerError", 500
            )
        },
        contract=VLLM,
    )
    vllm = engine(recorder)
    assert vllm.rollback_trusted is False
    with pytest.raises(EngineRejected, match="missing tensor"):
        await vllm.load_weights(Path("/staging/a/step-2"), "step-2", kind=SnapshotKind.FULL)
    # and its label no longer names any snapshot: the weights are unknown
    assert [path for _, path, _, _ in recorder.calls()] == [
        "/collective_rpc",
        "/update_weight_version",
    ]


# --- item 3: a keep pause keeps the cache only when told --------------------------------


async def test_in_place_pause_keeps_the_cache_for_the_keep_policies() -> None:
    recorder = ReleasedRecorder({("POST", "/pause"): paused()}, contract=VLLM)
    vllm = engine(recorder)
    await vllm.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.NONE)
    await vllm.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.NEW_SESSION)
    await vllm.pause(PauseMode.IN_PLACE)
    await vllm.pause(PauseMode.WAIT)
    assert [query for _, _, query, _ in recorder.calls()] == [
        {"mode": ["keep"], "clear_cache": ["false"]},
        {"mode": ["keep"], "clear_cache": ["false"]},
        {"mode": ["keep"], "clear_cache": ["false"]},
        {"mode": ["keep"], "clear_cache": ["false"]},  # WAIT: `wait` refuses new ones in 0.33
    ]


async def test_all_policy_clears_the_cache_at_the_pause_and_needs_no_reset_after() -> None:
    """``clear_cache=true`` resets with running requests included: it cannot be refused,
    unlike ``/reset_prefix_cache`` while blocks are held."""
    recorder = ReleasedRecorder(
        {
            ("POST", "/pause"): paused(),
            ("POST", "/collective_rpc"): answer(
                VLLM, "POST", "/collective_rpc", {"results": [None]}
            ),
            ("POST", "/update_weight_version"): answer(
                VLLM, "POST", "/update_weight_version", {"success": True, "new_version": "s-3"}
            ),
            ("POST", "/resume"): resumed(),
        },
        contract=VLLM,
    )
    vllm = engine(recorder)
    await vllm.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.ALL)
    await vllm.load_weights(Path("/staging/b/s-3"), "s-3", kind=SnapshotKind.FULL)
    await vllm.resume()
    await vllm.reset_cache(KvCachePolicy.ALL)
    calls = recorder.calls()
    assert calls[0][2] == {"mode": ["keep"], "clear_cache": ["true"]}
    assert "/reset_prefix_cache" not in [path for _, path, _, _ in calls]


# --- item 7: "default" and the instance id ---------------------------------------------


async def test_the_launch_version_means_no_snapshot_loaded() -> None:
    recorder = ReleasedRecorder(
        {
            ("GET", "/weight_info"): answer(
                VLLM, "GET", "/weight_info", {"weight_version": "default"}
            )
        },
        contract=VLLM,
    )
    assert await engine(recorder).served_identity() is None


# --- item 8: what a 404 means, spans in the last chunk ---------------------------------


async def test_lora_404_for_a_missing_adapter_path_is_not_blamed_on_the_flag() -> None:
    recorder = ReleasedRecorder(
        {
            ("POST", "/v1/load_lora_adapter"): vllm_error(
                "Loading lora l-1 failed: No adapter found for /staging/a/l-1",
                "NotFoundError",
                404,
            )
        },
        contract=VLLM,
    )
    with pytest.raises(EngineRejected) as raised:
        await engine(recorder).load_weights(Path("/staging/a/l-1"), "l-1", kind=SnapshotKind.LORA)
    assert "No adapter found" in str(raised.value)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in str(raised.value)


async def test_lora_404_without_the_route_names_the_flags_to_set() -> None:
    # The route table says the route exists only with the flag; unregistered, vLLM's
    # HTTPException handler answers the generic 404.
    recorder = ReleasedRecorder(
        {("POST", "/v1/load_lora_adapter"): vllm_error("Not Found", "Not Found", 404)},
        contract=VLLM,
    )
    with pytest.raises(EngineRejected, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        await engine(recorder).load_weights(Path("/staging/a/l-1"), "l-1", kind=SnapshotKind.LORA)


def test_spans_are_objects_and_only_the_last_chunk_has_them() -> None:
    vllm = VLLMEngine(BASE)
    middle = VLLM.example(
        "CompletionStreamResponse",
        model="m",
        choices=[VLLM.example("CompletionResponseStreamChoice", index=0, text="x")],
    )
    assert vllm.identities_of(middle) == []
    spans = [
        {"version": "s-1", "start": 0, "end": 3},
        {"version": "s-2", "start": 3, "end": 3},  # labelled, but sampled no token
        {"version": "s-3", "start": 3, "end": 8},
    ]
    last = VLLM.example(
        "CompletionStreamResponse",
        model="m",
        choices=[
            VLLM.example(
                "CompletionResponseStreamChoice",
                index=0,
                text="y",
                finish_reason="length",
                weight_versions=spans,
            )
        ],
    )
    assert vllm.identities_of(last) == ["s-1", "s-3"]


async def test_requests_ask_for_spans_with_the_released_field() -> None:
    vllm = engine(ReleasedRecorder({}, contract=VLLM))
    await vllm.probe()
    body = vllm.prepare_request("/v1/completions", {"model": "m", "prompt": "p"})
    VLLM.check_request("POST", "/v1/completions", {}, body)
    assert body["return_weight_versions"] is True


async def test_lora_success_is_plain_text() -> None:
    recorder = ReleasedRecorder(
        {
            ("POST", "/v1/load_lora_adapter"): text_answer(
                "Success: LoRA adapter 'l-1' added successfully."
            ),
            ("POST", "/update_weight_version"): answer(
                VLLM, "POST", "/update_weight_version", {"success": True, "new_version": "l-1"}
            ),
        },
        contract=VLLM,
    )
    vllm = engine(recorder)
    await vllm.load_weights(Path("/staging/a/l-1"), "l-1", kind=SnapshotKind.LORA)
    assert vllm.prepare_request("/v1/completions", {"model": "m"})["model"] == "l-1"


# --- what the engine can tell: instance and checksum -----------------------------------


async def test_the_instance_id_comes_from_dev_mode_server_info() -> None:
    info = {"vllm_config": {"instance_id": "1795453342881933890"}, "vllm_env": {}}
    recorder = ReleasedRecorder(
        {("GET", "/server_info"): answer(VLLM, "GET", "/server_info", {**info, "system_env": {}})},
        contract=VLLM,
    )
    assert await engine(recorder).instance_id() == "1795453342881933890"
    assert recorder.calls() == [("GET", "/server_info", {"config_format": ["json"]}, None)]


async def test_the_weights_checksum_is_one_digest_over_every_parameter() -> None:
    checksums = {"model.layers.0.qkv_proj.weight": "aa" * 32, "lm_head.weight": "bb" * 32}
    recorder = ReleasedRecorder(
        {
            ("POST", "/weight_checker"): answer(
                VLLM, "POST", "/weight_checker", {"checksums": checksums}
            )
        },
        contract=VLLM,
    )
    digest = await engine(recorder).weights_checksum()
    assert digest == checksums_digest(checksums)
    assert recorder.calls() == [("POST", "/weight_checker", {}, {"action": "checksum"})]


def checker(value: str) -> httpx.Response:
    return answer(VLLM, "POST", "/weight_checker", {"checksums": {"w": value}})


async def test_verify_digest_refuses_a_reload_that_serves_other_weights_than_before() -> None:
    routes = {
        ("POST", "/collective_rpc"): answer(VLLM, "POST", "/collective_rpc", {"results": [None]}),
        ("POST", "/update_weight_version"): answer(
            VLLM, "POST", "/update_weight_version", {"success": True, "new_version": "x"}
        ),
        ("POST", "/weight_checker"): [checker("a1"), checker("b1"), checker("a2")],
    }
    vllm = engine(ReleasedRecorder(routes, contract=VLLM), verify_digest=True)
    await vllm.load_weights(Path("/staging/0/s-1"), "s-1", kind=SnapshotKind.FULL)
    await vllm.load_weights(Path("/staging/1/s-2"), "s-2", kind=SnapshotKind.FULL)
    with pytest.raises(EngineRejected, match="other weights than when s-1"):
        await vllm.load_weights(Path("/staging/0/s-1"), "s-1", kind=SnapshotKind.FULL)


async def test_without_verify_digest_the_costly_checker_is_never_called() -> None:
    routes = {
        ("POST", "/collective_rpc"): answer(VLLM, "POST", "/collective_rpc", {"results": [None]}),
        ("POST", "/update_weight_version"): answer(
            VLLM, "POST", "/update_weight_version", {"success": True, "new_version": "x"}
        ),
    }
    recorder = ReleasedRecorder(routes, contract=VLLM)
    await engine(recorder).load_weights(Path("/staging/0/s-1"), "s-1", kind=SnapshotKind.FULL)
    assert "/weight_checker" not in [path for _, path, _, _ in recorder.calls()]


async def test_reloading_the_served_adapter_loads_it_in_place() -> None:
    """vLLM answers 400 "already loaded" to a name it holds unless load_inplace is set."""
    routes = {
        ("POST", "/v1/load_lora_adapter"): text_answer("Success: LoRA adapter 'l-1' added."),
        ("POST", "/update_weight_version"): answer(
            VLLM, "POST", "/update_weight_version", {"success": True, "new_version": "l-1"}
        ),
    }
    recorder = ReleasedRecorder(routes, contract=VLLM)
    vllm = engine(recorder)
    await vllm.load_weights(Path("/staging/0/l-1"), "l-1", kind=SnapshotKind.LORA)
    await vllm.load_weights(Path("/staging/0/l-1"), "l-1", kind=SnapshotKind.LORA)
    loads = [body for _, path, _, body in recorder.calls() if path == "/v1/load_lora_adapter"]
    assert [body["load_inplace"] for body in loads] == [False, True]
