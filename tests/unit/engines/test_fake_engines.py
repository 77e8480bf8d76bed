"""The fake engines behave like the released servers where hotload depends on it.

Each behaviour here is one the adapters' fixes rest on, read from the released source
(docs/engines.md): if a fake drifted from it, the end-to-end tests would prove nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from fastapi import FastAPI
from safetensors.numpy import save_file

from hotload.api import RolloutDeployment
from hotload.engines.engine_checksum import checksums_digest
from hotload.errors import ConfigError
from hotload.operator.workload import engine_command
from hotload.testing.sglang_app import SGLangOptions
from hotload.testing.sglang_app import create_app as sglang_app
from hotload.testing.sglang_lora import check_lora_args, lora_args_of
from hotload.testing.vllm_app import VLLMOptions
from hotload.testing.vllm_app import create_app as vllm_app
from hotload.testing.weights import snapshot_checksums

TOKEN_S = 0.005
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def snapshot(directory: Path, seed: int) -> Path:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    tensors = {
        f"model.layers.{i}.w": rng.standard_normal((4, 4)).astype(np.float32) for i in range(6)
    }
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text("{}")
    return directory


@pytest.fixture
def snapshots(tmp_path: Path) -> dict[str, Path]:
    return {name: snapshot(tmp_path / name, seed) for seed, name in enumerate(("a", "b"))}


async def client_for(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as c:
        yield c


@pytest.fixture
async def sglang(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    extra = getattr(request, "param", {})
    options = SGLangOptions(
        model_path="/models/base", served_name="base", token_interval=TOKEN_S, **extra
    )
    async for client in client_for(sglang_app(options)):
        yield client


@pytest.fixture
async def vllm(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    extra = {"dev_mode": True, **getattr(request, "param", {})}
    options = VLLMOptions(model="/models/base", served_name="base", token_interval=TOKEN_S, **extra)
    async for client in client_for(vllm_app(options)):
        yield client


async def state(client: httpx.AsyncClient) -> dict[str, object]:
    body: dict[str, object] = (await client.get("/hotload_fake/state")).json()
    return body


def data_chunks(stream: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]


async def held_generation(client: httpx.AsyncClient) -> asyncio.Task[httpx.Response]:
    body = {"model": "base", "prompt": "p", "max_tokens": 50}
    task = asyncio.create_task(client.post("/v1/completions", json=body))
    for _ in range(200):
        if (await state(client))["running"]:
            return task
        await asyncio.sleep(0.005)
    raise AssertionError("the generation never started")


async def test_sglang_failed_load_leaves_mixed_weights_under_the_old_version(
    sglang: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    loaded = await sglang.post(
        "/update_weights_from_disk",
        json={"model_path": str(snapshots["a"]), "weight_version": "a", "flush_cache": False},
    )
    assert loaded.json()["success"] is True
    await sglang.post("/hotload_fake/fail_next_load", json={"after_tensors": 3})
    failed = await sglang.post(
        "/update_weights_from_disk",
        json={"model_path": str(snapshots["b"]), "weight_version": "b", "flush_cache": False},
    )
    assert failed.status_code == 400 and "Rolling back" in failed.json()["message"]
    info = (await sglang.get("/model_info")).json()
    assert info["weight_version"] == "a"  # the label says a...
    served = (await state(sglang))["checksums"]
    assert served != snapshot_checksums(snapshots["a"])  # ...the weights are not a
    assert served != snapshot_checksums(snapshots["b"])  # nor b: a mix


async def test_sglang_renames_its_served_model_to_the_loaded_path(
    sglang: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    await sglang.post(
        "/update_weights_from_disk",
        json={"model_path": str(snapshots["a"]), "weight_version": "a", "flush_cache": False},
    )
    models = (await sglang.get("/v1/models")).json()
    assert [card["id"] for card in models["data"]] == [str(snapshots["a"])]
    info = (await sglang.get("/model_info")).json()
    assert info["served_model_name"] == info["model_path"] == str(snapshots["a"])


async def test_sglang_reads_an_unserved_model_with_a_colon_as_an_adapter(
    sglang: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    body = {"model": "base:v2", "prompt": "p", "max_tokens": 1}
    assert (await sglang.post("/v1/completions", json=body)).status_code == 400
    body = {"model": "base", "prompt": "p", "max_tokens": 1}
    assert (await sglang.post("/v1/completions", json=body)).status_code == 200


async def test_sglang_flush_refused_while_an_in_place_pause_holds_a_batch_allowed_in_retract(
    sglang: httpx.AsyncClient,
) -> None:
    """scheduler.py:5518-5546 (timeout=0: the waiting queue is ignored while paused) and
    flush_wrapper.py:22-61 (timeout > 0: fully idle, waiting queue included)."""
    task = await held_generation(sglang)
    await sglang.post("/pause_generation", json={"mode": "in_place"})
    assert (await sglang.post("/flush_cache", params={"timeout": 0})).status_code == 400
    assert (await sglang.post("/flush_cache", params={"timeout": 0.05})).status_code == 400
    await sglang.post("/pause_generation", json={"mode": "retract"})
    # The retracted request waits in the queue: a flush with a timeout waits for it...
    assert (await sglang.post("/flush_cache", params={"timeout": 0.05})).status_code == 400
    # ...one without a timeout, while paused, does not.
    assert (await sglang.post("/flush_cache", params={"timeout": 0})).status_code == 200
    await sglang.post("/continue_generation", json={})
    assert (await sglang.post("/flush_cache", params={"timeout": 0})).status_code == 400
    assert (await task).status_code == 200
    assert (await state(sglang))["counters"]["reprefilled"] == 1  # type: ignore[index]


async def test_sglang_update_flushes_under_the_paused_rule_or_fails_leaving_the_label(
    sglang: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    """weight_updater.py:120-131: a refused flush fails the update although the weights
    changed; the version and model path stay (tokenizer_manager.py:2315-2320)."""
    task = await held_generation(sglang)
    await sglang.post("/pause_generation", json={"mode": "in_place"})
    update = {"model_path": str(snapshots["a"]), "weight_version": "a", "flush_cache": True}
    refused = await sglang.post("/update_weights_from_disk", json=update)
    assert refused.status_code == 400 and "not flushed" in refused.json()["message"]
    assert (await sglang.get("/model_info")).json()["weight_version"] == "default"
    assert (await state(sglang))["checksums"] == snapshot_checksums(snapshots["a"])
    await sglang.post("/pause_generation", json={"mode": "retract"})
    update = {**update, "model_path": str(snapshots["b"]), "weight_version": "b"}
    assert (await sglang.post("/update_weights_from_disk", json=update)).json()["success"]
    assert (await sglang.get("/model_info")).json()["weight_version"] == "b"
    await sglang.post("/continue_generation", json={})
    assert (await task).status_code == 200


@pytest.mark.parametrize("sglang", [{"health_timeout": 0.1}], indirect=True)
async def test_sglang_health_generates_and_fails_while_paused_ready_too_ping_does_not(
    sglang: httpx.AsyncClient,
) -> None:
    """http_server.py:714-718 (/ready: not paused and healthy), 2190-2199 (/ping: healthy)."""
    assert (await sglang.get("/ready")).status_code == 200
    await sglang.post("/pause_generation", json={"mode": "in_place"})
    assert (await sglang.get("/health")).status_code == 503
    assert (await sglang.get("/ready")).status_code == 503
    assert (await sglang.get("/ping")).status_code == 200
    await sglang.post("/continue_generation", json={})
    assert (await sglang.get("/ready")).status_code == 200


LORA_ENABLED = {"enable_lora": True, "max_lora_rank": 8, "lora_target_modules": ("all",)}


@pytest.mark.parametrize("sglang", [LORA_ENABLED], indirect=True)
async def test_sglang_unload_waits_for_the_adapters_requests_which_a_pause_holds(
    sglang: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    """tokenizer_control_mixin.py:633-657 and lora_registry.py:186-203: the unload waits
    until no request uses the adapter; one paused in place does until the resume."""
    loaded = await sglang.post(
        "/load_lora_adapter", json={"lora_name": "l1", "lora_path": str(snapshots["a"])}
    )
    assert loaded.status_code == 200
    body = {"model": "base", "prompt": "p", "max_tokens": 40, "lora_path": "l1"}
    task = asyncio.create_task(sglang.post("/v1/completions", json=body))
    for _ in range(200):
        if (await state(sglang))["lora"]["in_use"]:  # type: ignore[index]
            break
        await asyncio.sleep(0.005)
    await sglang.post("/pause_generation", json={"mode": "in_place"})
    unload = asyncio.create_task(sglang.post("/unload_lora_adapter", json={"lora_name": "l1"}))
    await asyncio.sleep(0.3)
    assert not unload.done()  # held by the paused request
    assert (await sglang.get("/v1/models")).json()["data"][1:] == []  # unregistered at once
    await sglang.post("/continue_generation", json={})
    assert (await unload).status_code == 200
    assert (await task).status_code == 200


def test_sglang_enable_lora_without_initial_adapters_needs_rank_and_modules() -> None:
    """lora_hook.py:151-154: 0.5.23 refuses to start otherwise."""
    with pytest.raises(ConfigError, match="--max-lora-rank and --lora-target-modules"):
        sglang_app(SGLangOptions(model_path="/m", enable_lora=True))
    sglang_app(SGLangOptions(model_path="/m", **LORA_ENABLED))  # type: ignore[arg-type]


def test_the_sglang_example_starts_as_the_operator_renders_it() -> None:
    """examples/rolloutdeployment-sglang.yaml once passed --enable-lora alone: 0.5.23's
    startup assertion (lora_hook.py:151-154) refused the command the operator made."""
    document = yaml.safe_load((EXAMPLES / "rolloutdeployment-sglang.yaml").read_text())
    command = engine_command(RolloutDeployment.model_validate(document))
    arguments = lora_args_of(command)
    assert arguments["enable_lora"] is True
    check_lora_args(**arguments)


@pytest.mark.parametrize("sglang", [{"api_key": "user", "admin_api_key": "admin"}], indirect=True)
async def test_sglang_with_both_keys_splits_admin_routes_from_the_rest(
    sglang: httpx.AsyncClient,
) -> None:
    def bearer(key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    assert (await sglang.get("/model_info", headers=bearer("admin"))).status_code == 401
    assert (await sglang.get("/model_info", headers=bearer("user"))).status_code == 200
    flush = "/flush_cache"
    assert (await sglang.post(flush, headers=bearer("user"))).status_code == 401
    assert (await sglang.post(flush, headers=bearer("admin"))).status_code == 200
    assert (await sglang.get("/ready")).status_code == 200  # probes need no key


async def test_sglang_v1_answers_carry_metadata_versions_and_chunks_none(
    sglang: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    await sglang.post(
        "/update_weights_from_disk",
        json={"model_path": str(snapshots["a"]), "weight_version": "a", "flush_cache": False},
    )
    body = {"model": "base", "prompt": "p", "max_tokens": 2}
    answer = (await sglang.post("/v1/completions", json=body)).json()
    assert answer["metadata"] == {"weight_version": "a"}
    stream = await sglang.post("/v1/completions", json={**body, "stream": True})
    chunks = data_chunks(stream)
    assert chunks and all("metadata" not in chunk for chunk in chunks)
    digest = checksums_digest(snapshot_checksums(snapshots["a"]))
    assert answer["choices"][0]["text"] == f"{digest[:6]} " * 2


async def test_vllm_pause_clears_the_cache_and_preempts_unless_told_not_to(
    vllm: httpx.AsyncClient,
) -> None:
    await vllm.post("/v1/completions", json={"model": "base", "prompt": "warm", "max_tokens": 1})
    assert (await state(vllm))["cache"] == {"warm": "default"}
    task = await held_generation(vllm)
    await vllm.post("/pause", params={"mode": "keep", "clear_cache": "false"})
    assert (await state(vllm))["cache"] == {"warm": "default"}
    await vllm.post("/resume")
    await vllm.post("/pause", params={"mode": "keep"})
    after = await state(vllm)
    assert after["cache"] == {}
    assert after["counters"]["preempted"] == 1  # type: ignore[index]
    await vllm.post("/resume")
    assert (await task).status_code == 200


async def test_vllm_weight_versions_come_only_in_the_last_chunk(
    vllm: httpx.AsyncClient,
) -> None:
    body = {"model": "base", "prompt": "p", "max_tokens": 3, "return_weight_versions": True}
    stream = await vllm.post("/v1/completions", json={**body, "stream": True})
    chunks = data_chunks(stream)
    spans = [chunk["choices"][0]["weight_versions"] for chunk in chunks]
    assert spans[:-1] == [None] * (len(chunks) - 1)
    assert spans[-1] == [{"version": "default", "start": 0, "end": 3}]


async def test_vllm_starts_at_default_and_names_its_instance(vllm: httpx.AsyncClient) -> None:
    assert (await vllm.get("/weight_info")).json() == {"weight_version": "default"}
    info = (await vllm.get("/server_info", params={"config_format": "json"})).json()
    assert info["vllm_config"]["instance_id"].isdigit()


@pytest.mark.parametrize("vllm", [{"dev_mode": False, "runtime_lora": True}], indirect=True)
async def test_vllm_404_means_no_route_or_no_adapter_told_apart_by_type(
    vllm: httpx.AsyncClient,
) -> None:
    missing_route = await vllm.post("/collective_rpc", json={"method": "reload_weights"})
    assert missing_route.status_code == 404
    assert missing_route.json()["error"]["type"] == "Not Found"
    missing_path = await vllm.post(
        "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nowhere"}
    )
    assert missing_path.status_code == 404
    assert missing_path.json()["error"]["type"] == "NotFoundError"


async def test_vllm_failed_reload_leaves_mixed_weights_and_the_version(
    vllm: httpx.AsyncClient, snapshots: dict[str, Path]
) -> None:
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(snapshots["a"])}}
    assert (await vllm.post("/collective_rpc", json=rpc)).status_code == 200
    await vllm.post("/update_weight_version", json={"new_version": "a"})
    await vllm.post("/hotload_fake/fail_next_load", json={"after_tensors": 2})
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(snapshots["b"])}}
    assert (await vllm.post("/collective_rpc", json=rpc)).status_code == 500
    assert (await vllm.get("/weight_info")).json() == {"weight_version": "a"}
    checksums = (await vllm.post("/weight_checker", json={"action": "checksum"})).json()
    assert checksums["checksums"] not in (
        snapshot_checksums(snapshots["a"]),
        snapshot_checksums(snapshots["b"]),
    )


async def test_requests_the_released_server_refuses_are_refused(
    sglang: httpx.AsyncClient, vllm: httpx.AsyncClient
) -> None:
    assert (await sglang.post("/pause_generation", json={"mode": "keep"})).status_code == 422
    assert (await vllm.post("/pause", params={"mode": "in_place"})).status_code == 422


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_route_a_fake_serves_is_a_released_route(engine: str) -> None:
    from fastapi.routing import APIRoute

    from hotload.testing.contract import EngineContract

    if engine == "sglang":
        app = sglang_app(SGLangOptions(model_path="/m"))
    else:
        app = vllm_app(VLLMOptions(model="/m", dev_mode=True, runtime_lora=True))
    contract = EngineContract.load(engine)
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute) and not route.path.startswith("/hotload_fake/")
        for method in route.methods
    }
    assert served, "the fake serves no route"
    assert served <= set(contract.routes), sorted(served - set(contract.routes))
