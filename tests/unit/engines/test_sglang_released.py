"""SGLang 0.5.23 as released: the adapter against the route table and models of the wheel.

One test per item of the "real engines" issue that concerns SGLang; every request is
checked by :class:`ReleasedRecorder` against the released handlers, every scripted answer
is built from the released models (``SGLANG.example``) or checked against the handler.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.engines import PauseMode, SGLangEngine
from hotload.engines.identity_fields import UNKNOWN_VERSION
from hotload.errors import EngineRejected
from tests.unit.engines.recorder import ok
from tests.unit.engines.released import SGLANG, ReleasedRecorder, answer, text_answer

BASE = "http://10.0.0.1:30000"  # never contacted: the transport is a mock


def engine(recorder: ReleasedRecorder, **kwargs: object) -> SGLangEngine:
    return SGLangEngine(BASE, recorder.client(), **kwargs)  # type: ignore[arg-type]


def model_info(**values: object) -> httpx.Response:
    payload = {"model_path": "/models/base", "served_model_name": "base", **values}
    return answer(SGLANG, "GET", "/model_info", payload)


def update_answer(success: bool, message: str) -> httpx.Response:
    payload = {"success": success, "message": message, "num_paused_requests": 0}
    return answer(SGLANG, "POST", "/update_weights_from_disk", payload, 200 if success else 400)


# --- item 1: the per-response version of /v1 answers -----------------------------------


def test_v1_answers_name_their_weights_in_metadata() -> None:
    sglang = SGLangEngine(BASE)
    choice = SGLANG.example("CompletionResponseChoice", index=0, text="x")
    plain = SGLANG.example(
        "CompletionResponse", model="m", choices=[choice], metadata={"weight_version": "step-3"}
    )
    assert sglang.identities_of(plain) == ["step-3"]
    spans = [
        {"version": "step-2", "start": 0, "end": 4},
        {"version": "step-3", "start": 4, "end": 9},
    ]
    chat_choice = SGLANG.example(
        "ChatCompletionResponseChoice", index=0, message={"role": "assistant", "content": "x"}
    )
    across = SGLANG.example(
        "ChatCompletionResponse",
        model="m",
        choices=[chat_choice],
        metadata={"weight_version": "step-3", "weight_versions": spans},
    )
    assert sglang.identities_of(across) == ["step-2", "step-3"]


def test_v1_stream_chunks_carry_no_version_so_the_sidecar_labels_them() -> None:
    chunk = SGLANG.example(
        "ChatCompletionStreamResponse",
        model="m",
        choices=[
            SGLANG.example("ChatCompletionResponseStreamChoice", index=0, delta={"content": "x"})
        ],
    )
    assert SGLangEngine(BASE).identities_of(chunk) == []


# --- item 2: a failed load leaves the weights unknown ----------------------------------


async def test_a_failed_update_is_rejected_and_never_trusted_to_have_rolled_back() -> None:
    """0.5.23's rollback re-reads the new path: after a failure the weights are unknown."""
    recorder = ReleasedRecorder(
        {
            ("POST", "/update_weights_from_disk"): update_answer(
                False, "Failed to update weights: bad shape.\nRolling back to original weights."
            ),
            ("GET", "/model_info"): model_info(weight_version="step-7"),
            ("POST", "/update_weight_version"): answer(
                SGLANG,
                "POST",
                "/update_weight_version",
                {"success": True, "message": "ok", "new_version": UNKNOWN_VERSION},
            ),
        },
        contract=SGLANG,
    )
    sglang = engine(recorder)
    assert sglang.rollback_trusted is False
    with pytest.raises(EngineRejected, match="bad shape"):
        await sglang.load_weights(Path("/staging/a/step-8"), "step-8", kind=SnapshotKind.FULL)
    # 0.5.23 still says step-7 over part-new weights: the adapter names them unknown.
    assert [path for _, path, _, _ in recorder.calls()] == [
        "/update_weights_from_disk",
        "/update_weight_version",
    ]


# --- item 4: the `all` cache policy under traffic --------------------------------------


async def test_all_policy_pauses_in_retract_mode_and_the_update_flushes_while_paused() -> None:
    """In ``in_place`` mode a flush is refused while the held batch exists; retracted
    requests leave the running batch for the waiting queue, which a flush run *while
    paused* ignores (scheduler.py:5518-5546): the update flushes right after loading,
    before they continue (and re-prefill on the new weights). A flush with a timeout
    would wait for that queue to empty (flush_wrapper.py:22-61): never sent paused."""
    recorder = ReleasedRecorder(
        {
            ("POST", "/pause_generation"): ok({"message": "ok", "status": "ok"}),
            ("POST", "/update_weights_from_disk"): update_answer(True, "Succeeded."),
            ("POST", "/continue_generation"): ok({"message": "ok", "status": "ok"}),
        },
        contract=SGLANG,
    )
    sglang = engine(recorder, flush_timeout=5.0)
    await sglang.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.ALL)
    await sglang.load_weights(Path("/staging/b/step-9"), "step-9", kind=SnapshotKind.FULL)
    await sglang.resume()
    await sglang.reset_cache(KvCachePolicy.ALL)  # already flushed while paused
    assert recorder.calls() == [
        ("POST", "/pause_generation", {}, {"mode": "retract"}),
        (
            "POST",
            "/update_weights_from_disk",
            {},
            {
                "model_path": "/staging/b/step-9",
                "weight_version": "step-9",
                "flush_cache": True,
                "abort_all_requests": False,
            },
        ),
        ("POST", "/continue_generation", {}, {}),
    ]


async def test_a_flush_refused_while_paused_is_retried_after_resuming() -> None:
    recorder = ReleasedRecorder(
        {
            ("POST", "/pause_generation"): ok({"message": "ok", "status": "ok"}),
            ("POST", "/flush_cache"): [
                text_answer("Flush cache failed.\n", 400),
                text_answer("Cache flushed.\n"),
            ],
            ("POST", "/continue_generation"): ok({"message": "ok", "status": "ok"}),
        },
        contract=SGLANG,
    )
    sglang = engine(recorder)
    await sglang.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.ALL)
    await sglang.resume()  # continues whatever the flush said: never left paused
    await sglang.reset_cache(KvCachePolicy.ALL)
    assert recorder.calls()[1][2] == {"timeout": ["0.0"]}  # paused: the queue not waited for
    assert [path for _, path, _, _ in recorder.calls()] == [
        "/pause_generation",
        "/flush_cache",
        "/continue_generation",
        "/flush_cache",
    ]


async def test_keep_policies_pause_in_place_and_keep_the_cache() -> None:
    recorder = ReleasedRecorder(
        {
            ("POST", "/pause_generation"): ok({"message": "ok", "status": "ok"}),
            ("POST", "/update_weights_from_disk"): update_answer(True, "Succeeded."),
            ("POST", "/continue_generation"): ok({"message": "ok", "status": "ok"}),
        },
        contract=SGLANG,
    )
    sglang = engine(recorder)
    await sglang.pause(PauseMode.IN_PLACE, cache_policy=KvCachePolicy.NEW_SESSION)
    await sglang.load_weights(Path("/staging/b/step-9"), "step-9", kind=SnapshotKind.FULL)
    await sglang.resume()
    await sglang.reset_cache(KvCachePolicy.NEW_SESSION)
    calls = recorder.calls()
    assert calls[0] == ("POST", "/pause_generation", {}, {"mode": "in_place"})
    assert calls[1][3]["flush_cache"] is False


async def test_all_policy_without_a_pause_flushes_with_a_timeout() -> None:
    """SYNC: the front drained the engine; the flush waits for idle up to its timeout."""
    recorder = ReleasedRecorder(
        {("POST", "/flush_cache"): text_answer("Cache flushed.\n")}, contract=SGLANG
    )
    await engine(recorder, flush_timeout=7.5).reset_cache(KvCachePolicy.ALL)
    assert recorder.calls() == [("POST", "/flush_cache", {"timeout": ["7.5"]}, None)]


# --- item 5: readiness without a generation --------------------------------------------


async def test_health_probes_ping_which_a_pause_does_not_fail() -> None:
    """``/ready`` answers 503 for the whole of a pause (http_server.py:714-718), ``/health``
    generates; ``/ping`` is ``is_healthy()`` only (http_server.py:2190-2199) and, not a
    probe path to SGLang's auth, takes the API key."""
    recorder = ReleasedRecorder(
        {("GET", "/ping"): httpx.Response(200)}, contract=SGLANG, api_key="user"
    )
    assert await engine(recorder, api_key="user", admin_api_key="admin").health() is True
    assert [(method, path) for method, path, _, _ in recorder.calls()] == [("GET", "/ping")]
    assert recorder.sent[0].headers["authorization"] == "Bearer user"


# --- item 6: an API key and an admin key -----------------------------------------------


async def test_admin_routes_carry_the_admin_key_and_model_info_the_api_key() -> None:
    recorder = ReleasedRecorder(
        {
            ("POST", "/continue_generation"): ok({"message": "ok", "status": "ok"}),
            ("GET", "/model_info"): model_info(weight_version="step-1"),
        },
        contract=SGLANG,
        api_key="user-key",
        admin_api_key="admin-key",
    )
    sglang = engine(recorder, api_key="user-key", admin_api_key="admin-key")
    await sglang.resume()
    assert await sglang.served_identity() == "step-1"
    headers = {sent.path: sent.headers["authorization"] for sent in recorder.sent}
    assert headers == {
        "/continue_generation": "Bearer admin-key",
        "/model_info": "Bearer user-key",
    }


async def test_one_key_serves_both_when_no_admin_key_is_set() -> None:
    recorder = ReleasedRecorder(
        {("POST", "/continue_generation"): ok({"message": "ok", "status": "ok"})},
        contract=SGLANG,
        api_key="only-key",
    )
    await engine(recorder, api_key="only-key").resume()
    assert recorder.sent[0].headers["authorization"] == "Bearer only-key"


# --- item 7: "default" is the launch value, not a snapshot -----------------------------


async def test_the_launch_version_means_no_snapshot_loaded() -> None:
    recorder = ReleasedRecorder(
        {("GET", "/model_info"): model_info(weight_version="default")}, contract=SGLANG
    )
    assert await engine(recorder).served_identity() is None


async def test_a_custom_launch_version_is_recognised_too() -> None:
    recorder = ReleasedRecorder(
        {("GET", "/model_info"): model_info(weight_version="base-v0")}, contract=SGLANG
    )
    assert await engine(recorder, launch_version="base-v0").served_identity() is None


# --- item 8: served_model_name becomes the staging path --------------------------------


async def test_requests_name_the_model_sglang_serves_under_after_a_disk_update() -> None:
    """0.5.23 reads a ``model`` that is not its served name as ``base:adapter``; after a
    disk update its served name is the staging path, so a client's ``qwen:7b`` would ask
    for a LoRA adapter ``7b`` that was never loaded (400)."""
    recorder = ReleasedRecorder(
        {("POST", "/update_weights_from_disk"): update_answer(True, "Succeeded.")},
        contract=SGLANG,
    )
    sglang = engine(recorder)
    body = {"model": "qwen:7b", "prompt": "p"}
    assert sglang.prepare_request("/v1/completions", body)["model"] == "qwen:7b"
    await sglang.load_weights(Path("/staging/b/step-9"), "step-9", kind=SnapshotKind.FULL)
    prepared = sglang.prepare_request("/v1/completions", body)
    SGLANG.check_request("POST", "/v1/completions", {}, prepared)
    assert prepared["model"] == "/staging/b/step-9"
    assert "lora_path" not in prepared


async def test_identity_comes_from_the_version_not_the_renamed_model() -> None:
    """After a disk update SGLang serves under ``served_model_name = <staging path>``."""
    recorder = ReleasedRecorder(
        {
            ("GET", "/model_info"): model_info(
                weight_version="step-9",
                model_path="/var/lib/hotload/staging/b/step-9",
                served_model_name="/var/lib/hotload/staging/b/step-9",
            ),
        },
        contract=SGLANG,
    )
    assert await engine(recorder).served_identity() == "step-9"
    models = SGLANG.example(
        "ModelList",
        data=[SGLANG.example("ModelCard", id="/var/lib/hotload/staging/b/step-9")],
    )
    assert SGLangEngine(BASE).identities_of(models) == []


async def test_the_weights_checksum_is_sglangs_per_engine_checksum() -> None:
    rank = SGLANG.example(
        "ChecksumInfo", checksums={"w": "00ff"}, per_gpu_checksum="1" * 64, parallelism_info=[]
    )
    payload = {"success": True, "message": "ok", "ranks": [rank], "per_engine_checksum": "e" * 64}
    recorder = ReleasedRecorder(
        {("POST", "/weights_checker"): answer(SGLANG, "POST", "/weights_checker", payload)},
        contract=SGLANG,
    )
    assert await engine(recorder).weights_checksum() == "e" * 64
    assert recorder.calls() == [("POST", "/weights_checker", {}, {"action": "checksum"})]


async def test_verify_digest_accepts_a_reload_with_the_checksum_it_had() -> None:
    def checked(value: str) -> httpx.Response:
        payload = {"success": True, "message": "ok", "per_engine_checksum": value}
        return answer(SGLANG, "POST", "/weights_checker", payload)

    routes = {
        ("POST", "/update_weights_from_disk"): update_answer(True, "Succeeded."),
        ("POST", "/weights_checker"): [checked("a"), checked("b"), checked("a"), checked("c")],
    }
    sglang = engine(ReleasedRecorder(routes, contract=SGLANG), verify_digest=True)
    await sglang.load_weights(Path("/staging/0/s-1"), "s-1", kind=SnapshotKind.FULL)
    await sglang.load_weights(Path("/staging/1/s-2"), "s-2", kind=SnapshotKind.FULL)
    await sglang.load_weights(Path("/staging/0/s-1"), "s-1", kind=SnapshotKind.FULL)
    with pytest.raises(EngineRejected, match="other weights than when s-2"):
        await sglang.load_weights(Path("/staging/1/s-2"), "s-2", kind=SnapshotKind.FULL)


async def test_reloading_the_served_adapter_unloads_it_first() -> None:
    """SGLang refuses to load a name it holds ("already exists")."""

    def lora(success: bool) -> httpx.Response:
        payload = SGLANG.example("LoRAUpdateOutput", success=success)
        return answer(SGLANG, "POST", "/load_lora_adapter", payload)

    routes = {
        ("POST", "/load_lora_adapter"): lora(True),
        ("POST", "/unload_lora_adapter"): lora(True),
        ("POST", "/update_weight_version"): answer(
            SGLANG,
            "POST",
            "/update_weight_version",
            {"success": True, "message": "ok", "new_version": "l-1"},
        ),
    }
    recorder = ReleasedRecorder(routes, contract=SGLANG)
    sglang = engine(recorder)
    await sglang.load_weights(Path("/staging/0/l-1"), "l-1", kind=SnapshotKind.LORA)
    await sglang.load_weights(Path("/staging/0/l-1"), "l-1", kind=SnapshotKind.LORA)
    assert [path for _, path, _, _ in recorder.calls()] == [
        "/load_lora_adapter",
        "/update_weight_version",
        "/unload_lora_adapter",
        "/load_lora_adapter",
        "/update_weight_version",
    ]
    assert sglang.active_lora == "l-1"
