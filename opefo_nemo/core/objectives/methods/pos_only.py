"""``pos_only`` (spec §5), an ablation of ``opefo``: only the entropy-increasing tokens S+ are
reweighted, by ``1 + λ*`` (:mod:`.balanced_policy_gradient`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.core.objectives.methods.balanced_policy_gradient import (
    BalancedConfig,
    BalancedFlowConfig,
    BalancedPolicyGradient,
)
from opefo_nemo.core.objectives.registry import register_objective


@dataclass(frozen=True)
class PositiveSideConfig(BalancedConfig):
    entropy_flow: BalancedFlowConfig = field(
        default_factory=lambda: BalancedFlowConfig(balance="pos_only")
    )


@register_objective("pos_only")
class PositiveSideOnly(BalancedPolicyGradient):
    """Ablation of ``opefo``: only the entropy-increasing set S+ is rescaled, by ``1 + λ*``
    (strict on-policy)."""

    config_type = PositiveSideConfig
    balances = ("pos_only",)
