"""The reference engine's choice of the next token: greedy below vLLM's sampling epsilon.

A temperature of 6e-59 (found by the front's fuzz test through a real engine) divided the
logits into inf, the softmax into NaN, and ``torch.multinomial`` raised: a 500 for a
request the schema accepts. vLLM samples greedily below 1e-5; so does the reference engine.

Would catch: a tiny positive temperature sampling (or raising) instead of taking the
argmax; a temperature at the epsilon no longer sampling.
"""

from __future__ import annotations

import pytest
import torch

from hotload.engines.reference.runtime import GREEDY_BELOW, GenerationRequest, ReferenceRuntime

LOGITS = torch.tensor([0.5, 3.0, -1.0, 2.9])


@pytest.mark.parametrize("temperature", [None, 0.0, 6e-59, 1e-30, GREEDY_BELOW / 2])
def test_a_temperature_below_the_epsilon_is_greedy(temperature: float | None) -> None:
    request = GenerationRequest(prompt=(1,), max_tokens=1, temperature=temperature)
    assert request.greedy
    assert ReferenceRuntime._choose(LOGITS, request, torch.Generator()) == 1


def test_a_temperature_at_the_epsilon_samples() -> None:
    request = GenerationRequest(prompt=(1,), max_tokens=1, temperature=GREEDY_BELOW)
    assert not request.greedy
    generator = torch.Generator().manual_seed(7)
    # Index 3 is 0.1 below index 1: at this temperature sampling is as sharp as argmax,
    # but it runs the sampler (no NaN, no error) rather than the greedy branch.
    assert ReferenceRuntime._choose(LOGITS, request, generator) == 1
    hot = GenerationRequest(prompt=(1,), max_tokens=1, temperature=10.0)
    picks = {ReferenceRuntime._choose(LOGITS, hot, generator) for _ in range(200)}
    assert picks == {0, 1, 2, 3}
