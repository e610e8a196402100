"""A short supervised phase so the embedded default starts with rewards neither all 0 nor all 1:
partly right samples, a state a policy-gradient method can improve by sharpening the policy, and
whose entropy it collapses (docs/training.md, "The embedded default").
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opefo_nemo.core.schema import require
from opefo_nemo.models.tiny import ALPHABET
from opefo_nemo.models.transformers_compat import load_causal_lm, quiet_progress

WARM_START_RATES = (
    "swap_rate",
    "carry_first_rate",
    "zero_carry_rate",
    "separator_rate",
    "shortcut_rate",
    "shortcut_slip_rate",
)


@dataclass(frozen=True)
class WarmStartConfig:
    """``model.warm_start``: the supervised phase that makes the embedded model, on worked
    solutions of the arithmetic task (``tasks/arithmetic.py``) written with slips and harmless
    choices at these odds. The settings are part of the recipe stored with the cached model
    (``tasks/embedded_model.py``)."""

    steps: int = 2000
    """Supervised steps (fewer leave the demo's model erring on the rarer ways of writing)."""
    lr: float = 3e-3
    """AdamW learning rate of the supervised phase, decaying linearly to 0."""
    batch_size: int = 128
    """Worked solutions per supervised step, each drawn afresh."""
    slip_rate: float = 0.4
    """Chance that a column's sum is off by one of ``slips`` (carries and answer follow it)."""
    slips: tuple[int, ...] = (-1,)
    """The offsets a slipped sum may be off by, drawn uniformly (non-zero)."""
    swap_rate: float = 0.15
    """Chance a column's two digits are written in the other order (``8+7=15``)."""
    carry_first_rate: float = 0.15
    """Chance a carry is written first rather than last (``1+4+3=8``)."""
    zero_carry_rate: float = 0.15
    """Chance a column without a carry writes it as ``+0``."""
    separators: str = ",:"
    """Characters that may follow a step instead of the space."""
    separator_rate: float = 0.3
    """Chance a step (not the last) is followed by one of ``separators``."""
    shortcut_rate: float = 0.0
    """Chance a solution is the shortcut answer (``tasks/shortcut.py``) instead of worked."""
    shortcut_slip_rate: float = 0.0
    """Chance that a column's sum in a shortcut answer is off by one of ``slips``."""
    seed: int = 0
    """Seed of the random initialisation and of the supervised phase."""

    def validate(self) -> None:
        """Ranges of the ``model.warm_start`` keys; errors name the key."""
        require(self.steps >= 1, "model.warm_start.steps", "must be >= 1")
        require(self.lr > 0, "model.warm_start.lr", "must be > 0")
        require(self.batch_size >= 1, "model.warm_start.batch_size", "must be >= 1")
        require(0 <= self.slip_rate < 1, "model.warm_start.slip_rate", "must be in [0, 1)")
        require(
            bool(self.slips) and 0 not in self.slips,
            "model.warm_start.slips",
            f"must be a non-empty list of non-zero offsets, got {list(self.slips)}",
        )
        for key in WARM_START_RATES:
            rate = getattr(self, key)
            require(0 <= rate <= 1, f"model.warm_start.{key}", f"must be in [0, 1], got {rate}")
        require(
            not self.separator_rate or bool(self.separators),
            "model.warm_start.separators",
            "is empty, but model.warm_start.separator_rate > 0 needs separators to choose from",
        )
        require(
            set(self.separators) <= set(ALPHABET) - set("0123456789+= \n"),
            "model.warm_start.separators",
            f"({self.separators!r}) must be characters of the tiny model's alphabet other than "
            "digits, '+', '=' and whitespace",
        )


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
    save to ``out_dir``. Teacher-forced cross-entropy on the response tokens only (the worked
    solution and end-of-sequence), AdamW with the learning rate decaying linearly from ``lr`` to
    0, fixed seed, ``steps`` mini-batches of ``batch_size`` pairs, each drawn afresh.

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
    with quiet_progress():
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
