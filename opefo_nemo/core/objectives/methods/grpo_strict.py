"""``grpo_strict`` (spec §3, §5): the strict on-policy policy gradient ``−w_t A_t log π(y_t)``
with ρ ≡ 1 and ``w ≡ 1``, optionally times a truncated importance-sampling weight; the base of
``opefo`` and its ablations (:mod:`.balanced_policy_gradient`) and of ``entropy_neutral``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from opefo_nemo.core.fidelity import truncated_is_weight
from opefo_nemo.core.objectives.base import BatchStatistics, MethodConfig, Objective
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.schema import require


@dataclass(frozen=True)
class StrictConfig(MethodConfig):
    """Settings of the strict on-policy policy gradient and of the methods built on it."""

    rollout_is_cap: float | None = None
    """null: off (the paper). A number c >= 1: each token's weight times the truncated
    importance-sampling weight min(π_train/π_rollout, c) (``core/fidelity.py``), correcting for
    the rollout engine sampling with its own kernels and precision (the ``fidelity/*`` metrics
    show how far the two differ)."""

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        cap = self.rollout_is_cap
        require(
            cap is None or (math.isfinite(cap) and cap >= 1),
            f"{prefix}.rollout_is_cap",
            f"must be >= 1 (or null: no correction), got {cap}",
        )


@register_objective("grpo_strict")
class StrictPolicyGradient(Objective):
    """GRPO, strict on-policy (paper Table 1, "GRPO (Strict on-policy)"): ``ℓ_t = −w_t A_t log
    π(y_t)`` with ρ ≡ 1 and ``w ≡ 1``, one full-batch update per rollout."""

    config_type: ClassVar[type[MethodConfig]] = StrictConfig

    def token_loss(self, inputs: LossInputs) -> Tensor:
        return -inputs.weight * inputs.advantages * inputs.logprob

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        return self.corrected(super().coefficients(batch, reducer, seed), batch.chunks)

    def corrected(
        self, coefficients: list[Coefficients], chunks: Sequence[TokenChunk]
    ) -> list[Coefficients]:
        """The weights times the truncated importance-sampling weight, when configured."""
        assert isinstance(self.config, StrictConfig)
        cap = self.config.rollout_is_cap
        if cap is None:
            return coefficients
        out = []
        for chunk, c in zip(chunks, coefficients, strict=True):
            if chunk.rollout_logprob is None:
                raise ValueError(
                    f"method.rollout_is_cap needs the rollout engine's logprobs "
                    f"(TokenChunk.rollout_logprob) for method {self.config.name!r}"
                )
            weight = c.weight * truncated_is_weight(chunk.logprob, chunk.rollout_logprob, cap)
            out.append(Coefficients(c.delta_h, weight, c.selected))
        return out
