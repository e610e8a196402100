"""The learning-rate schedule both engines follow (spec §8)."""

from __future__ import annotations


def warmup_factor(step: int, warmup_steps: int) -> float:
    """``min(1, (step + 1) / warmup_steps)`` at rollout step ``step`` (linear warm-up over the
    first ``warmup_steps`` rollout steps), 1 without warm-up; the learning rate is
    ``lr · warmup_factor``."""
    return 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)
