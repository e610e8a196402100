"""The reweighted strict policy gradient of ``opefo`` and its ablations (spec §3): each token's
weight is ``w₊`` on the entropy-increasing tokens S+ and ``w₋`` on the entropy-decreasing tokens
S−, from the batch's global P and N (``core.entropy_flow``); each method picks its balances."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from opefo_nemo.core.entropy_flow import balance, side_weights, target_shift
from opefo_nemo.core.objectives.base import BatchStatistics, MethodConfig
from opefo_nemo.core.objectives.entropy_target import (
    BALANCE,
    TargetedObjective,
    TargetFlowConfig,
)
from opefo_nemo.core.objectives.methods.grpo_strict import StrictConfig, StrictPolicyGradient
from opefo_nemo.core.objectives.tokens import Coefficients
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.schema import require


@dataclass(frozen=True)
class BalancedFlowConfig(TargetFlowConfig):
    """spec §3: how ``opefo`` and its ablations weigh the entropy-increasing tokens S+ (``w₊``)
    and the entropy-decreasing tokens S− (``w₋``), ``core.entropy_flow``."""

    balance: str = "adaptive"
    """adaptive: λ = λ* = (N − P) / (N + P) over the whole optimizer-step batch, zero predicted
    net flow (the paper) | target: λ = clip(λ* + target_gain · (target_entropy − H_batch), −1, 1)
    | static: a fixed λ, ``static_lambda`` | pos_only, neg_only: only S+ weighted, by 1 + λ*, or
    only S−, by 1 − λ*. ``opefo`` takes adaptive or target, each ablation its own name only."""
    static_lambda: float = field(default=0.001, metadata={BALANCE: "static"})
    """balance=static only: the fixed λ, in (−1, 1) (paper: 0.001)."""
    target_gain: float = field(default=1.0, metadata={BALANCE: "target"})
    """balance=target only: the gain g > 0; the predicted net flow is then g (H_target −
    H_batch)(P + N) (before λ's clip to [−1, 1])."""

    def validate(self, path: str) -> None:
        super().validate(path)
        require(
            math.isfinite(self.static_lambda) and -1 < self.static_lambda < 1,
            f"{path}.static_lambda",
            "must lie in (-1, 1)",
        )
        require(
            math.isfinite(self.target_gain) and self.target_gain > 0,
            f"{path}.target_gain",
            f"must be > 0, got {self.target_gain}",
        )


@dataclass(frozen=True)
class BalancedConfig(StrictConfig):
    entropy_flow: BalancedFlowConfig = field(default_factory=BalancedFlowConfig)


class BalancedPolicyGradient(TargetedObjective[BalancedFlowConfig], StrictPolicyGradient):
    """``w_t = w₊`` on S+, ``w₋`` on S− from the global P and N (spec §3)."""

    config_type = BalancedConfig

    def __init__(self, config: MethodConfig):
        super().__init__(config)
        self.applied_lambda = 0.0

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        flow, pos, neg = self.flow, batch.sums["flow_pos"], batch.sums["flow_neg"]
        target = self.target_entropy(batch)
        shift = (
            0.0 if target is None else target_shift(batch.mean_entropy, target, flow.target_gain)
        )
        lam, _, _ = side_weights(pos, neg, flow.balance, flow.static_lambda, shift)
        self.applied_lambda = float(lam)
        weighted = [
            Coefficients(
                delta_h=dh,
                weight=balance(dh, c.mask, pos, neg, flow.balance, flow.static_lambda, shift)[0],
                selected=c.mask.new_zeros(c.mask.shape),
            )
            for c, dh in zip(batch.chunks, batch.delta_h, strict=True)
        ]
        return self.corrected(weighted, batch.chunks)

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        return {"flow/lambda_applied": self.applied_lambda, **super().metrics(batch)}
