"""The strict on-policy methods: ``−w_t A_t log π(y_t)`` with ρ ≡ 1 (spec §3, §5).

``grpo_strict`` applies no weight (w ≡ 1). Every strict method can multiply its weights by the
truncated importance-sampling weight ``min(π_train/π_rollout, rollout_is_cap)`` of each sampled
token (``core.fidelity``; off by default, as in the paper), which corrects for the rollout
engine sampling with its own kernels and precision. ``opefo`` and its ablations weigh the
entropy-increasing tokens S+ by ``w₊`` and the entropy-decreasing tokens S− by ``w₋``
(``core.entropy_flow``):

* ``opefo``: ``balance: adaptive`` (``1 ± λ*``, zero predicted net flow) or ``target``
  (``λ = clip(λ* + g (H_target − H_batch), −1, 1)``: the predicted net flow is
  ``g (H_target − H_batch)(P + N)``, steering the batch entropy toward ``H_target``, a number or
  ``initial``, the first step's token-mean entropy, kept in the checkpoint);
* ``static``: a fixed λ; ``pos_only`` / ``neg_only``: only one side weighted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from ...entropy_flow import balance, side_weights, target_shift
from ...fidelity import truncated_is_weight
from ...reduction import BatchReducer
from ...schema import one_of, require
from ..base import BatchStatistics, EntropyFlowConfig, MethodConfig, Objective
from ..entropy_target import INITIAL, EntropyTarget, require_target
from ..registry import register_objective
from ..tokens import Coefficients, LossInputs, TokenChunk


@dataclass(frozen=True)
class StrictConfig(MethodConfig):
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
class BalancedFlowConfig(EntropyFlowConfig):
    """spec §3: the balancing variant and its settings (module docstring)."""

    balance: str = "adaptive"
    static_lambda: float = 0.001
    target_entropy: float | str = INITIAL
    target_gain: float = 1.0


@dataclass(frozen=True)
class BalancedConfig(StrictConfig):
    entropy_flow: BalancedFlowConfig = field(default_factory=BalancedFlowConfig)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        flow, path = self.entropy_flow, f"{prefix}.entropy_flow"
        require(
            math.isfinite(flow.static_lambda) and -1 < flow.static_lambda < 1,
            f"{path}.static_lambda",
            "must lie in (-1, 1)",
        )
        require_target(flow.target_entropy, f"{path}.target_entropy")
        require(
            math.isfinite(flow.target_gain) and flow.target_gain > 0,
            f"{path}.target_gain",
            f"must be > 0, got {flow.target_gain}",
        )


class BalancedPolicyGradient(StrictPolicyGradient):
    """``w_t = w₊`` on S+, ``w₋`` on S− from the global P and N (spec §3)."""

    config_type = BalancedConfig
    balances: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: MethodConfig):
        super().__init__(config)
        self.target = EntropyTarget(self.flow.target_entropy)
        self.applied_lambda = 0.0

    @property
    def flow(self) -> BalancedFlowConfig:
        assert isinstance(self.config, BalancedConfig)
        return self.config.entropy_flow

    @classmethod
    def check(cls, config: MethodConfig, prefix: str) -> None:
        super().check(config, prefix)
        assert isinstance(config, BalancedConfig)
        one_of(config.entropy_flow.balance, cls.balances, f"{prefix}.entropy_flow.balance")

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        flow, pos, neg = self.flow, batch.sums["flow_pos"], batch.sums["flow_neg"]
        shift = 0.0
        if flow.balance == "target":
            target = self.target.resolve(batch.mean_entropy)
            shift = target_shift(batch.mean_entropy, target, flow.target_gain)
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
        metrics = {"flow/lambda_applied": self.applied_lambda}
        if self.flow.balance == "target" and self.target.value is not None:
            metrics["flow/target_entropy"] = self.target.value
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return self.target.state_dict() if self.flow.balance == "target" else {}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.target.restore(state)


@register_objective("opefo")
class Opefo(BalancedPolicyGradient):
    """OPEFO: ``1 ± λ*`` (adaptive) or the closed-loop ``target`` balance."""

    balances = ("adaptive", "target")


@register_objective("static")
class StaticBalance(BalancedPolicyGradient):
    """Ablation: ``1 ± λ`` with a fixed ``static_lambda``."""

    balances = ("static",)


@register_objective("pos_only")
class PositiveSideOnly(BalancedPolicyGradient):
    """Ablation: only S+ weighted (``1 + λ*``)."""

    balances = ("pos_only",)


@register_objective("neg_only")
class NegativeSideOnly(BalancedPolicyGradient):
    """Ablation: only S− weighted (``1 − λ*``)."""

    balances = ("neg_only",)
