"""``static`` (spec §5), an ablation of ``opefo``: the tokens of S+ and S− weighted ``1 ± λ``
with a fixed ``static_lambda`` instead of the batch's λ* (:mod:`.balanced_policy_gradient`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.core.objectives.methods.balanced_policy_gradient import (
    BalancedConfig,
    BalancedFlowConfig,
    BalancedPolicyGradient,
)
from opefo_nemo.core.objectives.registry import register_objective


@dataclass(frozen=True)
class StaticConfig(BalancedConfig):
    entropy_flow: BalancedFlowConfig = field(
        default_factory=lambda: BalancedFlowConfig(balance="static")
    )


@register_objective("static")
class StaticBalance(BalancedPolicyGradient):
    """Ablation of ``opefo``: a fixed λ on both sides, ``1 ± static_lambda``, instead of the
    adaptive λ* (strict on-policy)."""

    config_type = StaticConfig
    balances = ("static",)
