"""The strict on-policy methods, ``−w_t A_t log π(y_t)`` with ρ ≡ 1 (spec §3, §5): ``grpo_strict``
(w ≡ 1), ``opefo`` and its ablations ``static``, ``pos_only``, ``neg_only``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from opefo_nemo.core.entropy_flow import balance, side_weights, target_shift
from opefo_nemo.core.fidelity import truncated_is_weight
from opefo_nemo.core.objectives.base import BatchStatistics, MethodConfig, Objective
from opefo_nemo.core.objectives.entropy_target import TargetedObjective, TargetFlowConfig
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.schema import require


@dataclass(frozen=True)
class StrictConfig(MethodConfig):
    # null: off (the paper); c >= 1: each token's weight times the truncated importance-sampling
    # weight min(π_train/π_rollout, c) (core.fidelity), correcting for the rollout engine
    # sampling with its own kernels and precision
    rollout_is_cap: float | None = None

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
    """``ℓ_t = −w_t A_t log π(y_t)``; here ``w ≡ 1`` (the paper's strict GRPO baseline)."""

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


@dataclass(frozen=True)
class BalancedFlowConfig(TargetFlowConfig):
    """spec §3: how ``opefo`` and its ablations weigh the entropy-increasing tokens S+ (``w₊``)
    and the entropy-decreasing tokens S− (``w₋``), ``core.entropy_flow``."""

    static_lambda: float = 0.001  # balance=static: the fixed λ, in (−1, 1)
    target_gain: float = 1.0  # balance=target: g > 0, λ = clip(λ* + g (H_target − H), −1, 1)

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


@register_objective("opefo")
class Opefo(BalancedPolicyGradient):
    """OPEFO: ``balance: adaptive``, ``1 ± λ*`` (zero predicted net flow), or ``target``, ``λ =
    clip(λ* + g (H_target − H_batch), −1, 1)``: the predicted net flow ``g (H_target −
    H_batch)(P + N)`` steers the batch entropy toward ``H_target``."""

    balances = ("adaptive", "target")


@dataclass(frozen=True)
class StaticConfig(BalancedConfig):
    entropy_flow: BalancedFlowConfig = field(
        default_factory=lambda: BalancedFlowConfig(balance="static")
    )


@dataclass(frozen=True)
class PositiveSideConfig(BalancedConfig):
    entropy_flow: BalancedFlowConfig = field(
        default_factory=lambda: BalancedFlowConfig(balance="pos_only")
    )


@dataclass(frozen=True)
class NegativeSideConfig(BalancedConfig):
    entropy_flow: BalancedFlowConfig = field(
        default_factory=lambda: BalancedFlowConfig(balance="neg_only")
    )


@register_objective("static")
class StaticBalance(BalancedPolicyGradient):
    """Ablation: ``1 ± λ`` with a fixed ``static_lambda``."""

    config_type = StaticConfig
    balances = ("static",)


@register_objective("pos_only")
class PositiveSideOnly(BalancedPolicyGradient):
    """Ablation: only S+ weighted (``1 + λ*``)."""

    config_type = PositiveSideConfig
    balances = ("pos_only",)


@register_objective("neg_only")
class NegativeSideOnly(BalancedPolicyGradient):
    """Ablation: only S− weighted (``1 − λ*``)."""

    config_type = NegativeSideConfig
    balances = ("neg_only",)
