"""The reference engine as a real process (``hotload engine reference``), started once per
module on a loopback address given as ``POD_IP`` (the way a pod gives it), and the
snapshots a trainer would publish for it, built from the same config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from hotload.local.ports import free_port
from hotload.waiting import wait_until

START_DEADLINE_S: Final = 120.0
ENGINE_HOST: Final = "127.0.0.1"


#: Token ids the tests fingerprint the served weights with (BOS "Hotload").
PROBE: Final = (256, 72, 111, 116, 108, 111, 97, 100)


@dataclass
class EngineProcess:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_as: dict[str, str] = field(default_factory=dict)
    """identity, logits and weights digests right after start, before any test loads."""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _fetch(url: str, body: object = None) -> dict[str, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, str] = json.loads(answer.read())
        return result


def start_engine(workdir: Path, *extra: str, host: str = ENGINE_HOST) -> EngineProcess:
    """Start ``hotload engine reference`` with ``POD_IP=host``; return once ``/health``
    answers, with what it served at that moment recorded."""
    port = free_port(host)
    log_path = workdir / f"engine-{port}.log"
    hotload = shutil.which("hotload", path=str(Path(sys.executable).parent)) or "hotload"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [hotload, "engine", "reference", "--port", str(port), "--model-config", "tiny", *extra],
            env={**os.environ, "POD_IP": host, "HOTLOAD_LOG_LEVEL": "INFO"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    engine = EngineProcess(f"http://{host}:{port}", process, log_path)

    def healthy_or_exited() -> bool:
        if _healthy(engine.base_url):
            return True
        if process.poll() is not None:
            raise RuntimeError(f"the engine exited with {process.returncode}:\n{engine.log_tail()}")
        return False

    if not wait_until(healthy_or_exited, START_DEADLINE_S, interval_s=0.2):
        process.kill()
        raise RuntimeError(
            f"the engine did not answer in {START_DEADLINE_S} s:\n{engine.log_tail()}"
        )
    logits = _fetch(f"{engine.base_url}/admin/logits", {"prompt_token_ids": list(PROBE)})
    weights = _fetch(f"{engine.base_url}/admin/weights_digest")
    engine.started_as = {
        "identity": _fetch(f"{engine.base_url}/admin/identity")["identity"],
        "logits": logits["sha256"],
        "weights": weights["sha256"],
    }
    return engine


def stop_engine(engine: EngineProcess) -> None:
    engine.process.terminate()
    try:
        engine.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        engine.process.kill()
        engine.process.wait(timeout=10)


@pytest.fixture(scope="module")
def engine_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="module")
def reference_engine(engine_workdir: Path) -> Iterator[EngineProcess]:
    """One reference engine for the module (tests load what they need first)."""
    engine = start_engine(engine_workdir)
    try:
        yield engine
    finally:
        stop_engine(engine)


@pytest.fixture(scope="module")
def publish(engine_workdir: Path) -> Callable[[str, int], Path]:
    """``publish(identity, seed)``: a full snapshot directory as a trainer writes it."""
    from hotload.engines.reference import model as rm

    config = rm.build_config("tiny")

    def make(identity: str, seed: int) -> Path:
        directory = engine_workdir / "staging" / identity
        if not directory.exists():
            rm.save_snapshot(rm.build_model(config, seed=seed), directory)
        return directory

    return make
