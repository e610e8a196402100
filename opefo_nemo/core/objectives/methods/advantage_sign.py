"""Strict GRPO restricted to the tokens of one sign of the advantage (spec §5): positive and
negative sample reinforcement (Zhu et al. 2025, "The Surprising Effectiveness of Negative
Reinforcement in LLM Reasoning"), the base of ``correct_only`` and ``incorrect_only``."""

from __future__ import annotations

from typing import ClassVar

from opefo_nemo.core.objectives.base import BatchStatistics
from opefo_nemo.core.objectives.methods.grpo_strict import StrictPolicyGradient
from opefo_nemo.core.objectives.tokens import Coefficients
from opefo_nemo.core.reduction import BatchReducer


class SignedPolicyGradient(StrictPolicyGradient):
    """``ℓ_t = −w_t A_t log π(y_t)`` with ``w_t = 1`` where ``A_t`` has the sign
    :attr:`kept_sign` and 0 elsewhere (ρ ≡ 1). The loss keeps strict GRPO's denominator, every
    response token of the batch, so the gradient is exactly strict GRPO's share from the kept
    tokens, and the two signs' gradients add up to strict GRPO's. ``rollout_is_cap`` multiplies
    the kept weights as in ``grpo_strict``; ``flow/net_after_balance`` and ``flow/adv_shift``
    (spec §6) read these 0/1 weights."""

    kept_sign: ClassVar[int]
    """+1: keep the tokens with ``A_t > 0``; −1: those with ``A_t < 0``."""

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        kept = [
            Coefficients(
                delta_h=dh,
                weight=(c.advantages * self.kept_sign > 0).to(dh.dtype),
                selected=c.mask.new_zeros(c.mask.shape),
            )
            for c, dh in zip(batch.chunks, batch.delta_h, strict=True)
        ]
        return self.corrected(kept, batch.chunks)
