"""Two real vLLM replicas rolled through snapshots by the chart's operator and the sidecar.

The region of the session has the chart installed (its operator watches ``hl-*``); a
RolloutDeployment of two ``vllm/vllm-openai:v0.32.0`` replicas (the pod runtime runs them
from hack/install-vllm's virtualenv) serves the tiny Llama and follows a trainer
(:class:`LlamaChain`): a Full, deltas (rebuilt by the sidecar, reloaded by vLLM), a Full
vLLM refuses, a LoRA adapter and back to the base, then an engine restart.

What a replica serves is never taken from hotload's word alone: every check compares the
label the front puts on a response (streamed or not) with what the engine itself says
(``/weight_info``) and produces (its greedy tokens, asked directly, within the same server:
compiled and eager modes of two servers may differ). One deployment for the module: each
vLLM start costs minutes here, and at most two servers run at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from hotload.api import pod as contract
from hotload.local import LocalRegions
from hotload.waiting import wait_until
from tests.fixtures.cluster import Kubectl, namespace_everywhere
from tests.fixtures.vllm import IMAGE, SERVER_ARGS, START_DEADLINE_S
from tests.integration.engines.llama_chain import LlamaChain
from tests.integration.operator.conftest import DEPLOYMENT, TOLERATION, PodHistory, Rollout
from tests.integration.operator.tiny_chain import TinyChain, TinySnapshot

pytestmark = [pytest.mark.engine_vllm, pytest.mark.cluster]

ENGINE_PORT = 8000
PROMPT = "The replica serves"
#: A vLLM start on a busy two-core machine: minutes (tests/fixtures/vllm.py).
START_TIMEOUT_S = START_DEADLINE_S
SWAP_TIMEOUT_S = 180.0
STREAM_TOKENS = 400


@dataclass
class Replica:
    name: str
    ip: str

    @property
    def front(self) -> str:
        return f"http://{self.ip}:{contract.SIDECAR_PORT}"

    @property
    def engine(self) -> str:
        return f"http://{self.ip}:{ENGINE_PORT}"


@dataclass
class Fleet:
    rollout: Rollout
    chain: LlamaChain
    history: PodHistory
    http: httpx.Client
    published: dict[str, TinySnapshot] = field(default_factory=dict)

    def replicas(self) -> list[Replica]:
        pods = sorted(self.rollout.pods(), key=lambda p: str(p.metadata.name))
        return [Replica(str(p.metadata.name), str(p.status.pod_ip)) for p in pods]

    def publish(self, how: str) -> TinySnapshot:
        snapshot = asyncio.run(self.chain.publish(how))
        self.rollout.apply(snapshot.policy_snapshot(self.rollout.name))
        self.published[how] = snapshot
        return snapshot

    def annotations(self, replica: Replica) -> dict[str, str]:
        pod = self.rollout.core.read_namespaced_pod(replica.name, self.rollout.namespace)
        return dict(pod.metadata.annotations or {})

    def wait_serving(self, identity: str, timeout_s: float = SWAP_TIMEOUT_S) -> None:
        """Both pods Ready on ``identity`` by their own report, and the engines agree."""

        def serving() -> bool:
            replicas = self.replicas()
            return len(replicas) == 2 and all(
                self.annotations(r).get(contract.ANNOTATION_SNAPSHOT) == identity
                and self.annotations(r).get(contract.ANNOTATION_STATE) == "Ready"
                for r in replicas
            )

        self.rollout.wait_for(f"both replicas Ready on {identity}", serving, timeout_s)
        for replica in self.replicas():
            assert weight_version(self.http, replica) == identity


def weight_version(http: httpx.Client, replica: Replica) -> str:
    answer = http.get(f"{replica.engine}/weight_info")
    answer.raise_for_status()
    return str(answer.json()["weight_version"])


def completion(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }


def direct_tokens(
    http: httpx.Client, replica: Replica, model: str, body: dict[str, Any]
) -> list[int]:
    """The engine's own greedy tokens for ``body`` (bypassing the front)."""
    answer = http.post(f"{replica.engine}/v1/completions", json={**body, "model": model})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


@dataclass
class Streamed:
    prompt_ids: list[int]
    chunks: list[tuple[str, list[int]]]
    """(label, token ids) of every chunk."""


def stream(http: httpx.Client, url: str, body: dict[str, Any]) -> Streamed:
    """A streamed completion through ``url``: the prompt's token ids and every chunk."""
    out = Streamed([], [])
    with http.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                payload = json.loads(line[6:])
                choice = payload["choices"][0]
                out.prompt_ids = out.prompt_ids or list(choice.get("prompt_token_ids") or [])
                out.chunks.append((payload["model"], list(choice.get("token_ids") or [])))
    return out


def check_every_answer_names_what_the_engine_serves(
    fleet: Fleet, identity: str, model: str | None = None
) -> dict[str, list[int]]:
    """On each replica, streamed and not, through the front: the label is ``identity``,
    the engine says it serves it before and after, and the tokens are the engine's own
    greedy tokens asked directly (``model``: the adapter, for a LoRA). Returns them."""
    seen: dict[str, list[int]] = {}
    body = completion(16)
    for replica in fleet.replicas():
        assert weight_version(fleet.http, replica) == identity
        truth = direct_tokens(fleet.http, replica, model or "policy", body)
        answer = fleet.http.post(
            f"{replica.front}/v1/completions", json={**body, "model": "policy"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == f"policy@{identity}"
        assert answer.headers[contract.POLICY_HEADER] == identity
        assert answer.json()["choices"][0]["token_ids"] == truth
        chunks = stream(fleet.http, replica.front, {**body, "model": "policy"}).chunks
        assert {label for label, _ in chunks} == {f"policy@{identity}"}
        assert [t for _, ids in chunks for t in ids] == truth
        assert weight_version(fleet.http, replica) == identity
        seen[replica.name] = truth
    return seen


class Streams:
    """Back-to-back greedy streams through one replica's front while a swap rolls out: the
    one the swap lands in shows both labels, in order."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.done: list[Streamed] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=300, trust_env=False) as http:
            while not self._stop.is_set():
                try:
                    body = completion(STREAM_TOKENS, model="policy")
                    self.done.append(stream(http, self.replica.front, body))
                except (httpx.HTTPError, AssertionError) as err:
                    self.errors.append(f"{type(err).__name__}: {err}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=300)


def check_streams_across_the_swap(fleet: Fleet, streams: Streams, before: str, after: str) -> int:
    """Every stream ran to its end; its labels are one identity or ``before`` then
    ``after``; a stream that spans the swap continued on the new weights exactly as the
    engine, asked directly, continues that prefix (the ``all`` policy preempts it, so it
    is recomputed on the new weights). Returns how many spanned it."""
    assert not streams.errors, streams.errors
    spanning = 0
    labels = {f"policy@{before}": before, f"policy@{after}": after}
    for streamed in streams.done:
        chunks = streamed.chunks
        names = [labels[label] for label, _ in chunks]
        assert sum(len(ids) for _, ids in chunks) == STREAM_TOKENS  # survived, to the end
        order = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
        assert order in ([before], [after], [before, after]), order
        if order != [before, after]:
            continue
        spanning += 1
        old = [t for label, ids in chunks for t in ids if labels[label] == before]
        new = [t for label, ids in chunks for t in ids if labels[label] == after]
        body = {"prompt": streamed.prompt_ids + old, "max_tokens": len(new), "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        assert direct_tokens(fleet.http, streams.replica, "policy", body) == new
    return spanning


@pytest.fixture(scope="module")
def fleet(
    operated_regions: LocalRegions,
    kubectl: Kubectl,
    kube_clients: dict[str, k8s.ApiClient],
    tiny_llama_dir: Path,
    vllm_venv: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """Two vLLM replicas serving the first Full, Ready by their own report."""
    region = operated_regions.regions[0].name
    namespace = f"hl-vllm-rollout-{secrets.token_hex(3)}"
    workdir = tmp_path_factory.mktemp("vllm-rollout")
    bucket = workdir / "bucket"
    bucket.mkdir()
    chain = LlamaChain(bucket, workdir / "trainer")
    with namespace_everywhere(namespace, kube_clients):
        rollout = Rollout(kubectl, kube_clients[region], region, namespace,
                          TinyChain(bucket, workdir / "unused"))  # fmt: skip
        history = rollout.history()
        rollout.apply(
            {
                "apiVersion": "hotload.dev/v1alpha1",
                "kind": "RolloutDeployment",
                "metadata": {"name": DEPLOYMENT},
                "spec": {
                    "model": {"name": str(tiny_llama_dir), "servedName": "policy"},
                    "engine": {
                        "kind": "vllm",
                        "image": IMAGE,
                        "port": ENGINE_PORT,
                        # Eager: no compile at start (each start costs minutes here); the
                        # greedy output is compared within one server, so the mode is moot.
                        "args": [*SERVER_ARGS, "--enforce-eager"],
                        "verifyDigest": True,
                    },
                    "replicas": 2,
                    "hotLoad": {
                        "bucketUrl": f"file://{bucket}",
                        "transition": "ASYNC",
                        "kvCachePolicy": "all",
                    },
                    "scheduling": {"tolerations": [TOLERATION]},
                },
            }
        )
        with httpx.Client(timeout=120, trust_env=False) as http:
            built = Fleet(rollout, chain, history, http)
            try:
                first = built.publish("full")
                built.wait_serving(first.identity, START_TIMEOUT_S)
                yield built
            finally:
                history.stop()
                rollout.run("delete", "rolloutdeployment", DEPLOYMENT, "--wait=false")
                wait_until(lambda: not rollout.pods(), 120, interval_s=1.0)


def test_a_full_is_served_and_every_answer_names_it(fleet: Fleet) -> None:
    full = fleet.published["full"]
    check_every_answer_names_what_the_engine_serves(fleet, full.identity)
    for replica in fleet.replicas():
        assert fleet.annotations(replica)[contract.ANNOTATION_VIA] == "full"


def test_deltas_are_rebuilt_and_reloaded_while_streams_in_flight_survive(fleet: Fleet) -> None:
    """ASYNC with the `all` policy: vLLM paused (keep, clearing the cache) around each
    reload; a stream in flight is held, then recomputed and continued on the new weights,
    and the front's labels switch exactly where the weights did."""
    before = fleet.published["full"].identity
    seen_before = check_every_answer_names_what_the_engine_serves(fleet, before)
    spanning = 0
    for _ in range(2):
        streams = [Streams(replica) for replica in fleet.replicas()]
        try:
            delta = fleet.publish("delta")
            fleet.wait_serving(delta.identity)
        finally:
            for each in streams:
                each.stop()
        for each in streams:
            spanning += check_streams_across_the_swap(fleet, each, before, delta.identity)
        seen = check_every_answer_names_what_the_engine_serves(fleet, delta.identity)
        assert all(seen[name] != seen_before[name] for name in seen)  # the weights moved
        for replica in fleet.replicas():
            assert fleet.annotations(replica)[contract.ANNOTATION_VIA] == "delta"
        before, seen_before = delta.identity, seen
    assert spanning >= 1, "no stream was in flight at any of the four swaps"


def test_a_full_vllm_refuses_never_reads_ready_and_the_engine_keeps_serving(
    fleet: Fleet,
) -> None:
    """A Full whose files verify but whose tensor vLLM cannot load: the reload answers
    500 and leaves the weights on meta; the handover reloads the served snapshot before
    any request runs. The pods say Failed on it, never Ready; the engines live."""
    served = fleet.published["delta"].identity
    expected = check_every_answer_names_what_the_engine_serves(fleet, served)
    bad = fleet.publish("bad")

    def failed() -> bool:
        return all(
            fleet.annotations(r).get(contract.ANNOTATION_FAILED_SNAPSHOT) == bad.identity
            for r in fleet.replicas()
        )

    fleet.rollout.wait_for(f"both replicas Failed on {bad.identity}", failed, SWAP_TIMEOUT_S)
    for replica in fleet.replicas():
        notes = fleet.annotations(replica)
        assert notes[contract.ANNOTATION_REASON] == "EngineRejected"
        assert notes.get(contract.ANNOTATION_SNAPSHOT) == served
    assert check_every_answer_names_what_the_engine_serves(fleet, served) == expected
    assert not [seen for seen in fleet.history.seen if seen[1] == bad.identity]


def test_a_lora_snapshot_is_routed_to_and_a_delta_takes_the_base_back(fleet: Fleet) -> None:
    base = fleet.published["delta"].identity
    base_tokens = check_every_answer_names_what_the_engine_serves(fleet, base)
    lora = fleet.publish("lora")
    fleet.wait_serving(lora.identity)
    with_lora = check_every_answer_names_what_the_engine_serves(fleet, lora.identity, lora.identity)
    assert all(with_lora[name] != base_tokens[name] for name in with_lora)
    for replica in fleet.replicas():
        models = fleet.http.get(f"{replica.engine}/v1/models").json()["data"]
        assert [m["id"] for m in models if m.get("parent")] == [lora.identity]
    back = fleet.publish("delta")
    fleet.wait_serving(back.identity)
    check_every_answer_names_what_the_engine_serves(fleet, back.identity)
    for replica in fleet.replicas():
        models = fleet.http.get(f"{replica.engine}/v1/models").json()["data"]
        assert [m["id"] for m in models if m.get("parent")] == []  # the adapter unloaded


def test_zz_an_engine_restart_is_seen_by_its_instance_id_and_the_snapshot_reloaded(
    fleet: Fleet,
) -> None:
    """The engine process of one replica is killed; the pod runtime starts it again. At its
    next check (every 5 s) the sidecar no longer names the old instance (the new start's
    first ``/server_info`` runs collect_env: its id may come a report later), drops the
    snapshot, reloads the served one (``via: reload``) and says Ready on it again; then it
    names the new instance, the one the engine gives."""
    served = fleet.published["delta"].identity
    replica = fleet.replicas()[0]

    def seen() -> dict[str, Any]:
        status: dict[str, Any] = fleet.http.get(f"{replica.front}/status").json()
        return status

    before = seen()["engineSeen"]["instanceId"]
    assert before
    os.kill(engine_pid(replica), signal.SIGKILL)

    def engine_up() -> bool:
        try:
            return fleet.http.get(f"{replica.engine}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    fleet.rollout.wait_for("the engine down", lambda: not engine_up(), 60)
    fleet.rollout.wait_for("the engine started again", engine_up, START_TIMEOUT_S)
    answered = time.monotonic()

    def old_instance_gone() -> bool:
        engine = seen()["engineSeen"]
        return bool(engine["answered"]) and engine["instanceId"] != before

    assert wait_until(old_instance_gone, 5.0 + 2.0, interval_s=0.2), seen()
    assert time.monotonic() - answered <= 5.0 + 2.0  # one check period, and a report

    # The sidecar's /status names the new instance before its pod write lands (the writer
    # runs beside the loop): until then the pod still carries what it said before the
    # restart. Wait for the report of the reload itself, then hold the engines to it.
    def reloaded() -> bool:
        annotations = fleet.annotations(replica)
        return (
            annotations.get(contract.ANNOTATION_VIA) == "reload"
            and annotations.get(contract.ANNOTATION_SNAPSHOT) == served
            and annotations.get(contract.ANNOTATION_STATE) == "Ready"
        )

    fleet.rollout.wait_for(f"the pod Ready on {served} via reload", reloaded, SWAP_TIMEOUT_S)
    fleet.wait_serving(served)
    assert fleet.annotations(replica)[contract.ANNOTATION_VIA] == "reload"
    check_every_answer_names_what_the_engine_serves(fleet, served)
    info = fleet.http.get(f"{replica.engine}/server_info", params={"config_format": "json"})
    new = str(info.json()["vllm_config"]["instance_id"])
    fleet.rollout.wait_for(
        "the sidecar to name the new instance",
        lambda: seen()["engineSeen"]["instanceId"] == new,
        30,
    )


def engine_pid(replica: Replica) -> int:
    """The vLLM API server of the replica: the first process whose command is ``vllm
    serve ... --host <its IP>`` (forked engine processes share the command line)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            any(a.endswith(b"/vllm") for a in argv[:2])
            and b"serve" in argv
            and (replica.ip.encode() in argv)
        ):
            found.append(int(entry.name))
    assert found, f"no vLLM process serves {replica.ip}"
    return min(found)
