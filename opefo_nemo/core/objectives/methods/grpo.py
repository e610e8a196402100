"""``grpo`` (spec §5): GRPO with ratio clipping, the approximate on-policy baseline
(:mod:`.clipped_surrogate` holds its loss and clip metrics)."""

from __future__ import annotations

from opefo_nemo.core.objectives.methods.clipped_surrogate import ClippedSurrogate
from opefo_nemo.core.objectives.registry import register_objective


@register_objective("grpo")
class Grpo(ClippedSurrogate):
    """GRPO (paper Table 1): the clipped surrogate, ε 0.2 / 0.2, 8 sequential mini-batch updates
    per rollout."""
