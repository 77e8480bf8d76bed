"""The reference engine, for real: hot swaps without a restart, bit-exact weights, strict
refusals that keep the old weights serving, pausing across a swap, LoRA, cache policies.

Driven through the ``ReferenceEngine`` adapter, as the sidecar drives it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from hotload.api import KvCachePolicy, SnapshotKind
from hotload.api.pod import SESSION_HEADER
from hotload.engines import PauseMode, ReferenceEngine
from hotload.engines.reference import model as rm
from hotload.engines.reference.weights import merge_lora
from hotload.errors import EngineRejected
from hotload.waiting import wait_until_async
from tests.integration.engines.conftest import PROBE as CONFTEST_PROBE
from tests.integration.engines.conftest import EngineProcess, start_engine, stop_engine

PROBE = list(CONFTEST_PROBE)
Publish = Callable[[str, int], Path]


@pytest.fixture
async def engine(reference_engine: EngineProcess) -> AsyncIterator[ReferenceEngine]:
    adapter = ReferenceEngine(reference_engine.base_url)
    await adapter.wait_ready(timeout=30)
    try:
        yield adapter
    finally:
        await adapter.resume()  # never leave the shared engine paused for the next test
        await adapter.aclose()


async def admin(
    engine: ReferenceEngine, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=30) as client:
        response = await client.request(method, path, json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


async def complete(
    engine: ReferenceEngine, prompt: str | list[int], **extra: Any
) -> dict[str, Any]:
    headers = {SESSION_HEADER: extra.pop("session")} if "session" in extra else {}
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client:
        response = await client.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 8, **extra}, headers=headers
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


def expected_digests(directory: Path) -> tuple[str, str]:
    """What the trainer's own weights give, computed in this process."""
    model = rm.load_model(directory)
    return rm.logits_digest(model, PROBE).sha256, rm.weights_digest(model, torch.bfloat16)


async def served_digests(engine: ReferenceEngine) -> tuple[str, str, str]:
    logits = await admin(engine, "POST", "/admin/logits", {"prompt_token_ids": PROBE})
    weights = await admin(engine, "GET", "/admin/weights_digest")
    assert logits["identity"] == weights["identity"]
    return logits["identity"], logits["sha256"], weights["sha256"]


def test_starts_on_the_seeded_init_bit_for_bit(
    reference_engine: EngineProcess, tmp_path: Path
) -> None:
    init = rm.save_snapshot(rm.build_model(rm.build_config("tiny"), seed=0), tmp_path / "init")
    logits, weights = expected_digests(init)
    assert reference_engine.started_as == {"identity": "init", "logits": logits, "weights": weights}


def test_starts_on_given_weights_and_binds_only_the_pod_ip(
    publish: Publish, tmp_path: Path
) -> None:
    """``--weights`` serves a snapshot from the start; the server listens on $POD_IP only."""
    engine = start_engine(
        tmp_path, "--weights", str(publish("step-1", 1)), "--identity", "step-1", host="127.0.0.2"
    )
    try:
        logits, weights = expected_digests(publish("step-1", 1))
        assert engine.started_as == {"identity": "step-1", "logits": logits, "weights": weights}
        port = int(engine.base_url.rsplit(":", 1)[1])
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        stop_engine(engine)


async def test_loaded_snapshot_is_served_bit_exact_and_named_in_every_response(
    engine: ReferenceEngine, publish: Publish
) -> None:
    for identity, seed in (("step-1", 1), ("step-2", 2)):
        directory = publish(identity, seed)
        await engine.load_weights(directory, identity, kind=SnapshotKind.FULL)

        assert await engine.served_identity() == identity
        assert await served_digests(engine) == (identity, *expected_digests(directory))
        answer = await complete(engine, "The policy is")
        assert answer["hotload_identity"] == identity
        assert engine.identities_of(answer) == [identity]
        assert answer["model"] == "reference"


async def test_chat_completions_name_the_identity_too(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("step-3", 3), "step-3", kind=SnapshotKind.INCREMENTAL)
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
    body = response.json()
    assert response.status_code == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["hotload_identities"] == ["step-3"]


async def test_greedy_by_default_and_seeded_sampling_is_repeatable(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
    greedy = [
        (await complete(engine, PROBE, max_tokens=12))["choices"][0]["token_ids"] for _ in range(2)
    ]
    sampled = [
        (await complete(engine, PROBE, max_tokens=12, temperature=1.5, seed=seed))["choices"][0][
            "token_ids"
        ]
        for seed in (7, 7, 8)
    ]
    assert greedy[0] == greedy[1]
    assert sampled[0] == sampled[1]
    assert sampled[0] != sampled[2] or sampled[0] != greedy[0]


def _broken(
    directory: Path, target: Path, change: Callable[[dict[str, torch.Tensor]], None]
) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text((directory / "config.json").read_text())
    tensors = load_file(str(directory / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(target / "model.safetensors"))
    return target


def _drop(tensors: dict[str, torch.Tensor]) -> None:
    del tensors["model.layers.1.mlp.down_proj.weight"]


def _extra(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.layers.9.surprise.weight"] = torch.zeros(2, dtype=torch.bfloat16)


def _reshape(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.norm.weight"] = torch.ones(63, dtype=torch.bfloat16)


def _widen(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.float32)


@pytest.mark.parametrize(
    ("case", "change", "message"),
    [
        ("missing-tensor", _drop, "do not match"),
        ("unexpected-tensor", _extra, "do not match"),
        ("wrong-shape", _reshape, "wrong shape"),
        ("wrong-dtype", _widen, "wrong dtype"),
    ],
)
async def test_bad_tensors_are_rejected_and_the_old_weights_keep_serving(
    engine: ReferenceEngine,
    publish: Publish,
    tmp_path: Path,
    case: str,
    change: Callable[[dict[str, torch.Tensor]], None],
    message: str,
) -> None:
    good = publish("step-1", 1)
    await engine.load_weights(good, "step-1", kind=SnapshotKind.FULL)
    before = await served_digests(engine)
    bad = _broken(publish("step-2", 2), tmp_path / case, change)

    with pytest.raises(EngineRejected, match=message):
        await engine.load_weights(bad, "step-2", kind=SnapshotKind.FULL)

    assert await served_digests(engine) == before
    assert (await complete(engine, "still"))["hotload_identity"] == "step-1"


async def test_other_architectures_unreadable_files_and_missing_dirs_are_rejected(
    engine: ReferenceEngine, publish: Publish, tmp_path: Path
) -> None:
    await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
    before = await served_digests(engine)

    other = rm.save_snapshot(rm.build_model(rm.build_config("small"), seed=1), tmp_path / "small")
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    data = (publish("step-2", 2) / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    config = json.loads((publish("step-2", 2) / "config.json").read_text())
    config["rope_theta"] = 1234.0
    retuned = _broken(publish("step-2", 2), tmp_path / "retuned", lambda tensors: None)
    (retuned / "config.json").write_text(json.dumps(config))

    for directory, message in (
        (other, "another architecture"),
        (truncated, "unreadable"),
        (retuned, "another architecture"),
        (tmp_path / "absent", "does not exist"),
        (Path("relative/step-2"), "must be absolute"),
    ):
        with pytest.raises(EngineRejected, match=message):
            await engine.load_weights(directory, "step-2", kind=SnapshotKind.FULL)
    assert await served_digests(engine) == before


async def _read_stream(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


async def test_pause_holds_a_stream_that_resumes_on_the_new_weights(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
    new = publish("step-2", 2)
    identities: list[str] = []
    async with (
        httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client,
        client.stream(
            "POST", "/v1/completions", json={"prompt": PROBE, "max_tokens": 60, "stream": True}
        ) as stream,
    ):
        chunks = _read_stream(stream)
        for _ in range(3):
            identities.append((await anext(chunks))["hotload_identity"])

        await engine.pause(PauseMode.IN_PLACE)
        state = await admin(engine, "GET", "/admin/identity")
        assert state["paused"] and state["active_generations"] >= 1
        queued = asyncio.create_task(complete(engine, "queued while paused"))

        async def held() -> bool:
            if queued.done():
                raise AssertionError("a request sent while paused was answered at once")
            return bool((await admin(engine, "GET", "/admin/identity"))["waiting_generations"])

        assert await wait_until_async(held, 30, interval_s=0.01), "never seen waiting"
        await engine.load_weights(new, "step-2", kind=SnapshotKind.FULL)
        assert not queued.done()  # new requests wait while paused
        await engine.resume()

        finish = None
        async for chunk in chunks:
            identities.append(chunk["hotload_identity"])
            finish = chunk["choices"][0]["finish_reason"] or finish
    assert finish == "length"
    assert len(identities) == 60
    switch = identities.index("step-2")
    assert set(identities[:switch]) == {"step-1"} and set(identities[switch:]) == {"step-2"}
    assert (await queued)["hotload_identities"] == ["step-2"]


async def test_wait_mode_lets_in_flight_requests_finish_on_the_old_weights(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
    in_flight = asyncio.create_task(complete(engine, PROBE, max_tokens=400))

    async def generating() -> bool:
        if in_flight.done():
            raise AssertionError("the completion ended before it was seen running")
        return bool((await admin(engine, "GET", "/admin/identity"))["active_generations"])

    assert await wait_until_async(generating, 60, interval_s=0.01), "never seen generating"
    await engine.pause(PauseMode.WAIT)  # returns once in-flight generations are done
    assert (await admin(engine, "GET", "/admin/identity"))["active_generations"] == 0
    await engine.load_weights(publish("step-2", 2), "step-2", kind=SnapshotKind.FULL)
    await engine.resume()
    assert (await in_flight)["hotload_identities"] == ["step-1"]


async def test_lora_adapter_is_merged_bit_exact_and_a_full_load_returns_to_the_base(
    engine: ReferenceEngine, publish: Publish, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model

    full = publish("step-1", 1)
    await engine.load_weights(full, "step-1", kind=SnapshotKind.FULL)
    base = rm.load_model(full)
    torch.manual_seed(5)
    adapter = get_peft_model(
        rm.load_model(full),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    adapter.save_pretrained(str(tmp_path / "lora-1"))
    merged = merge_lora(base, tmp_path / "lora-1")

    await engine.load_weights(tmp_path / "lora-1", "lora-1", kind=SnapshotKind.LORA)

    identity, logits, _ = await served_digests(engine)
    assert (identity, logits) == ("lora-1", rm.logits_digest(merged, PROBE).sha256)
    assert logits != rm.logits_digest(base, PROBE).sha256
    assert (await complete(engine, "adapted"))["hotload_identity"] == "lora-1"
    state = await admin(engine, "GET", "/admin/identity")
    assert state["kind"] == "LoRA"

    await engine.load_weights(publish("step-2", 2), "step-2", kind=SnapshotKind.FULL)
    assert await served_digests(engine) == ("step-2", *expected_digests(publish("step-2", 2)))


async def test_a_lora_snapshot_without_adapter_config_is_rejected(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
    with pytest.raises(EngineRejected, match=r"adapter_config\.json"):
        await engine.load_weights(publish("step-2", 2), "lora-x", kind=SnapshotKind.LORA)
    assert await engine.served_identity() == "step-1"


async def _cached(engine: ReferenceEngine, prompt: list[int], session: str) -> int:
    answer = await complete(engine, prompt, max_tokens=4, session=session)
    cached: int = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


async def test_cache_policies_after_a_swap(engine: ReferenceEngine, publish: Publish) -> None:
    """Running sessions keep their KV under none/new_session; new sessions reuse KV of the
    old weights only under none; after all, nothing computed by the old weights is reused."""
    shared = [256, *range(40, 70)]
    running_prompt = [*shared, *range(100, 120)]
    newcomer_prompt = [*shared, *range(150, 170)]
    for policy, newcomer_expected, running_keeps in (
        (KvCachePolicy.NONE, len(shared), True),
        (KvCachePolicy.NEW_SESSION, 0, True),
        (KvCachePolicy.ALL, 0, False),
    ):
        await engine.reset_cache(KvCachePolicy.ALL)
        await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
        await _cached(engine, running_prompt, f"running-{policy}")  # a session before the swap
        await engine.load_weights(publish("step-2", 2), "step-2", kind=SnapshotKind.FULL)
        await engine.reset_cache(policy)

        newcomer = await _cached(engine, newcomer_prompt, f"new-{policy}")
        running = await _cached(engine, [*running_prompt, 1, 2], f"running-{policy}")

        assert newcomer == newcomer_expected, policy
        assert (running >= len(running_prompt)) is running_keeps, policy
        assert running >= len(shared), policy  # the shared prefix is always reusable by then


async def test_a_client_that_goes_away_frees_its_generation(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("step-1", 1), "step-1", kind=SnapshotKind.FULL)
    async with (
        httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client,
        client.stream(
            "POST", "/v1/completions", json={"prompt": PROBE, "max_tokens": 2000, "stream": True}
        ) as stream,
    ):
        chunks = _read_stream(stream)
        await anext(chunks)
        assert (await admin(engine, "GET", "/admin/identity"))["active_generations"] == 1

    async def abandoned() -> bool:
        return bool((await admin(engine, "GET", "/admin/identity"))["active_generations"] == 0)

    assert await wait_until_async(abandoned, 10, interval_s=0.05), (
        "the abandoned generation kept running"
    )
    await asyncio.wait_for(engine.pause(PauseMode.WAIT), timeout=5)  # nothing left to wait for


# --- what the report says about loads and pauses nobody announced (issue 22, 6 and 9) ----
# A load under the name the engine already serves changed nothing the sidecar looked at
# (identity and instance stay): the report's generation (the engine's count of swaps)
# changes with every load and patch, whoever sent it, and the digest then tells other
# weights from the same. A pause sent by anyone shows as ``paused``.


async def test_a_foreign_load_under_the_served_name_changes_the_generation_and_digest(
    engine: ReferenceEngine, publish: Publish
) -> None:
    await engine.load_weights(publish("gen-1", 1), "gen-1", kind=SnapshotKind.FULL)
    ours = await engine.report(digest=True)
    assert ours.identity == "gen-1" and ours.generation is not None and ours.digest
    assert (await engine.report()).generation == ours.generation, "a look is not a load"

    async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client:
        foreign = {"path": str(publish("other-9", 9)), "identity": "gen-1", "kind": "Full"}
        (await client.post("/admin/load", json=foreign)).raise_for_status()

    theirs = await engine.report(digest=True)
    assert (theirs.identity, theirs.instance_id) == (ours.identity, ours.instance_id)
    assert theirs.generation != ours.generation
    assert theirs.digest != ours.digest

    # The same weights loaded again are a new generation with the same digest.
    await engine.load_weights(publish("gen-1", 1), "gen-1", kind=SnapshotKind.FULL)
    again = await engine.report(digest=True)
    assert again.generation not in (ours.generation, theirs.generation)
    assert again.digest == ours.digest


async def test_a_pause_shows_in_the_report_until_resumed(engine: ReferenceEngine) -> None:
    assert (await engine.report()).paused is False
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=30) as client:
        mode = {"mode": PauseMode.IN_PLACE.value}
        (await client.post("/admin/pause", json=mode)).raise_for_status()
    assert (await engine.report()).paused is True
    await engine.resume()
    assert (await engine.report()).paused is False
