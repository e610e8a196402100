"""A short supervised phase so the embedded default starts with rewards neither all 0 nor all 1.

Teacher-forced cross-entropy on the response tokens only (the worked solution and
end-of-sequence), AdamW with the learning rate decaying linearly from ``lr`` to 0, fixed seed,
``steps`` mini-batches of ``batch_size`` (prompt, response) pairs, each drawn afresh by ``draw``.
On the arithmetic task ``draw`` writes solutions with occasional slips
(:func:`opefo_nemo.tasks.arithmetic.worked_solution`), so the model learns to add but also to
slip now and then: its samples are partly right, a state a policy-gradient method can improve by
sharpening the policy, and whose entropy it collapses.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..models.transformers_compat import load_causal_lm

RECIPE_FILE = "opefo_warm_start.json"
#: A progress line (step, loss) every this many supervised steps.
LOG_EVERY = 50
log = logging.getLogger(__name__)


def supervised_warm_start(
    base_dir: Path,
    out_dir: Path,
    draw: Callable[[random.Random], tuple[list[int], list[int]]],
    *,
    steps: int,
    lr: float,
    seed: int,
    pad_id: int,
    recipe: dict[str, Any],
    batch_size: int,
) -> Path:
    """Fine-tune ``base_dir`` on ``(prompt_ids, response_ids)`` pairs drawn by ``draw(rng)``;
    save to ``out_dir``.

    ``recipe`` (JSON-serialisable: the settings that made this model) is saved beside the weights
    for :func:`read_recipe`. Returns ``out_dir``. Written into a sibling temporary directory and
    renamed, so an interrupted run leaves no half-written model behind.
    """
    import shutil

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = load_causal_lm(base_dir, torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * (1.0 - step / steps)
        batch = [draw(rng) for _ in range(batch_size)]
        ids, attention, labels = _pack(batch, pad_id)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0 or step + 1 == steps:
            log.info("warm start: step %d of %d, loss %.4f", step + 1, steps, float(loss.detach()))
    staging = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer = base_dir / "tokenizer"
    if tokenizer.is_dir():
        shutil.copytree(tokenizer, staging / "tokenizer")
    (staging / RECIPE_FILE).write_text(json.dumps(recipe, indent=1, sort_keys=True))
    staging.rename(out_dir)
    return out_dir


def read_recipe(model_dir: Path) -> dict[str, Any] | None:
    """The recipe a warm-started model was made with (``None`` if it has none)."""
    path = model_dir / RECIPE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _pack(batch: Sequence[tuple[list[int], list[int]]], pad_id: int):
    width = max(len(p) + len(r) for p, r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, (prompt, response) in enumerate(batch):
        full = prompt + response
        ids[row, : len(full)] = torch.tensor(full)
        attention[row, : len(full)] = 1
        labels[row, len(prompt) : len(full)] = torch.tensor(response)
    return ids, attention, labels
