"""After a failed load on an engine whose rollback is not trusted, its label proves nothing.

SGLang 0.5.23 and vLLM 0.33.0 keep the old version label over part-new weights after a
failed load (docs/engines.md, item 2): the planner must reload the served buffer, not
adopt the label. The end-to-end check is tests/integration/engines/test_fake_engine_pods.py.
"""

from __future__ import annotations

from hotload.api import SnapshotKind
from hotload.engines.protocol import EngineReport
from hotload.sidecar.planning import (
    Buffers,
    Slot,
    Staged,
    StepKind,
    Verdict,
    judge_engine,
    next_step,
)

GOOD = Staged("good", 1, SnapshotKind.FULL, "d1")


def served_good() -> Buffers:
    return Buffers({Slot.A: GOOD, Slot.B: None}, served=Slot.A, handed=None)


def test_the_old_label_is_adopted_when_the_weights_are_known() -> None:
    judgement = judge_engine(None, EngineReport("good", None, None), served_good())
    assert judgement.verdict is Verdict.ADOPT


def test_the_old_label_is_not_adopted_after_an_untrusted_failed_load() -> None:
    judgement = judge_engine(
        None, EngineReport("good", None, None), served_good(), weights_unknown=True
    )
    assert judgement.verdict is Verdict.EMPTY
    step = next_step(None, None, served_good(), None, engine_answers=True)
    assert (step.kind, step.slot) == (StepKind.RELOAD, Slot.A)
