"""``entropy_neutral``: strict GRPO whose applied update is corrected along ``∇θ H̄`` so that its
exact first-order entropy change is the step's target (spec §3, "Exact first order"; docs/core.md,
"The entropy-neutral update")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from opefo_nemo.core.objectives.base import BatchStatistics, MethodConfig
from opefo_nemo.core.objectives.entropy_target import (
    BALANCE,
    TargetedObjective,
    TargetFlowConfig,
)
from opefo_nemo.core.objectives.methods.grpo_strict import StrictConfig, StrictPolicyGradient
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.schema import require


@dataclass(frozen=True)
class NeutralFlowConfig(TargetFlowConfig):
    """The wanted first-order entropy change of each step (:meth:`EntropyNeutral.update_target`)."""

    balance: str = "adaptive"
    """adaptive: ⟨∇θH̄, Δθ'⟩ = 0, the entropy held to first order | target: ⟨∇θH̄, Δθ'⟩ =
    target_rate · (target_entropy − H̄), steering it to a target."""
    target_rate: float = field(default=0.1, metadata={BALANCE: "target"})
    """balance=target only: the share of the gap (target_entropy − H̄) closed per step to first
    order, in (0, 1]."""

    def validate(self, path: str) -> None:
        super().validate(path)
        require(
            math.isfinite(self.target_rate) and 0 < self.target_rate <= 1,
            f"{path}.target_rate",
            f"must lie in (0, 1] (the share of the entropy gap closed per step), got "
            f"{self.target_rate}",
        )


@dataclass(frozen=True)
class EntropyNeutralConfig(StrictConfig):
    entropy_flow: NeutralFlowConfig = field(default_factory=NeutralFlowConfig)


@register_objective("entropy_neutral")
class EntropyNeutral(TargetedObjective[NeutralFlowConfig], StrictPolicyGradient):
    """The entropy-neutral update (spec §3, "Exact first order"): strict GRPO's loss,
    ``−A_t log π(y_t)`` (w ≡ 1, optionally times the truncated importance-sampling weight); after
    the optimizer step the engine adds α ∇θH̄ to the applied update Δθ so that the exact
    first-order change of the batch's token-mean entropy, ⟨∇θH̄, Δθ'⟩, is
    :meth:`update_target`, what ``balance`` asks. Costs one more forward and backward of the
    batch per step (docs/core.md, "The entropy-neutral update")."""

    config_type: ClassVar[type[MethodConfig]] = EntropyNeutralConfig
    corrects_update = True
    balances = ("adaptive", "target")

    def update_target(self, batch: BatchStatistics) -> float:
        """``0`` (adaptive) or ``r (H_target − H̄)`` (target, ``r = target_rate``), in nats per
        step."""
        target = self.target_entropy(batch)
        return 0.0 if target is None else self.flow.target_rate * (target - batch.mean_entropy)
