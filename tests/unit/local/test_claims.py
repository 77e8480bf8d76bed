"""Index claims in the shared cache: a live claim elsewhere is refused, a stale one is not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hotload.errors import RegionIndexTaken
from hotload.local import claims
from hotload.local.processes import process_start_ticks


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("HOTLOAD_CACHE", str(cache))
    return cache


def test_claims_are_held_until_released(tmp_path: Path) -> None:
    state = tmp_path / "a"
    claims.claim({101: "region-1", 102: "region-2"}, state)
    assert claims.held_by(state) == [101, 102]
    claims.claim({101: "region-1"}, state)  # the same state may claim again
    assert claims.release(state) == [101, 102]
    assert claims.held_by(state) == []


def test_an_index_a_live_other_state_holds_is_refused(tmp_path: Path) -> None:
    claims.claim({150: "region-1"}, tmp_path / "a")  # owner: this (live) process
    with pytest.raises(RegionIndexTaken) as refused:
        claims.claim({149: "region-1", 150: "region-2"}, tmp_path / "b")
    assert refused.value.context == {"index": 150, "state_dir": str(tmp_path / "a")}
    assert claims.held_by(tmp_path / "b") == []  # all or nothing


def test_a_claim_whose_owner_and_processes_are_gone_is_taken_over(
    tmp_path: Path, private_cache: Path
) -> None:
    stale = claims.Claim(
        index=160,
        region="region-1",
        state_dir=str(tmp_path / "crashed"),
        owner_pid=os.getpid(),
        owner_start_ticks=process_start_ticks(os.getpid()) + 1,  # not this process
    )
    assert not claims.is_live(stale)
    (private_cache / "claims").mkdir(parents=True)
    (private_cache / "claims" / "index-160.json").write_text(stale.model_dump_json())
    claims.claim({160: "region-1"}, tmp_path / "new")
    assert claims.held_by(tmp_path / "new") == [160]
