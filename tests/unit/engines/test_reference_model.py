"""The reference model's config builder and tokenizer: what trainers, tests and bench share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hotload.engines.reference import model as rm
from hotload.engines.reference import tokenizer as tok
from hotload.errors import ConfigError


def test_named_sizes_build_the_documented_shapes() -> None:
    tiny = rm.build_config("tiny")
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.vocab_size) == (64, 2, 320)
    assert rm.storage_dtype(tiny) == torch.bfloat16
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):  # shapes only, no memory
        half_b = Qwen2ForCausalLM(rm.build_config("0.5b"))
    params = sum(param.numel() for param in rm.parameters(half_b).values())
    assert 450e6 < params < 520e6  # about half a billion, like Qwen2.5-0.5B


def test_same_seed_same_weights_and_other_seed_other_weights() -> None:
    config = rm.build_config("tiny")
    first = rm.weights_digest(rm.build_model(config, seed=3), torch.bfloat16)
    assert first == rm.weights_digest(rm.build_model(config, seed=3), torch.bfloat16)
    assert first != rm.weights_digest(rm.build_model(config, seed=4), torch.bfloat16)


def test_snapshot_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model = rm.build_model(rm.build_config("tiny"), seed=9)
    rm.save_snapshot(model, tmp_path / "snap")
    loaded = rm.load_model(tmp_path / "snap")
    assert rm.weights_digest(loaded, torch.bfloat16) == rm.weights_digest(model, torch.bfloat16)
    assert (
        rm.logits_digest(loaded, [256, 1, 2]).sha256 == rm.logits_digest(model, [256, 1, 2]).sha256
    )
    config = json.loads((tmp_path / "snap" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert rm.build_config(tmp_path / "snap").hidden_size == 64


def test_unknown_configs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        rm.build_config("huge")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError):
        rm.build_config(tmp_path)


def test_byte_tokenizer_round_trips_text_and_streams_utf8() -> None:
    ids = tok.encode("héllo")
    assert ids[0] == tok.BOS_ID
    assert tok.decode(ids) == "héllo"
    decoder = tok.StreamDecoder()
    pieces = [decoder.feed(token) for token in "é!".encode()] + [decoder.flush()]
    assert pieces == ["", "é", "!", ""]
    assert decoder.feed(tok.EOS_ID) == ""
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "<|user|>\nhi\n<|assistant|>\n"
