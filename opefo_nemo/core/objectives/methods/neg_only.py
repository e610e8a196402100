"""``neg_only`` (spec §5), an ablation of ``opefo``: only the entropy-decreasing tokens S− are
reweighted, by ``1 − λ*`` (:mod:`.balanced_policy_gradient`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.core.objectives.methods.balanced_policy_gradient import (
    BalancedConfig,
    BalancedFlowConfig,
    BalancedPolicyGradient,
)
from opefo_nemo.core.objectives.registry import register_objective


@dataclass(frozen=True)
class NegativeSideConfig(BalancedConfig):
    entropy_flow: BalancedFlowConfig = field(
        default_factory=lambda: BalancedFlowConfig(balance="neg_only")
    )


@register_objective("neg_only")
class NegativeSideOnly(BalancedPolicyGradient):
    """Ablation of ``opefo``: only the entropy-decreasing set S− is rescaled, by ``1 − λ*``
    (strict on-policy)."""

    config_type = NegativeSideConfig
    balances = ("neg_only",)
