"""The per-token losses ``ℓ_t`` of spec §5, registered by method name (methods may share one).

Each returns a tensor of the inputs' shape ``[*]``; aggregation (the global token mean) is done by
:func:`opefo_nemo.core.objectives.loss.policy_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import MethodConfig
from .registry import register_objective
from .tokens import LossInputs


def clipped_surrogate(inputs: LossInputs, eps_low: float, eps_high: float) -> Tensor:
    """PPO/GRPO surrogate ``max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high))``."""
    ratio = inputs.ratio
    adv = inputs.advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(-adv * ratio, -adv * clipped)


@register_objective("clip_higher", strict=False, ratio_clip=True)
@register_objective("grpo", strict=False, ratio_clip=True)
def grpo(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """GRPO with ratio clipping (paper: ε 0.2/0.2, 8 updates per rollout); ``clip_higher`` is the
    same loss with a relaxed upper bound (paper: ε_low 0.2, ε_high 0.28)."""
    return clipped_surrogate(inputs, config.clip_eps_low, config.clip_eps_high)


@register_objective("entropy_reg", strict=False, entropy_grad=True, ratio_clip=True)
def entropy_reg(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """GRPO minus ``β H_t`` with the entropy differentiated (paper: β = 0.01)."""
    if inputs.entropy is None:
        raise ValueError("entropy_reg needs the entropy with gradient in the update pass")
    surrogate = clipped_surrogate(inputs, config.clip_eps_low, config.clip_eps_high)
    return surrogate - config.entropy_coef * inputs.entropy


@register_objective("clip_cov", strict=False, selection="clip_cov", ratio_clip=True)
def clip_cov(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """GRPO with the gradient removed on the globally selected high-covariance tokens."""
    surrogate = clipped_surrogate(inputs, config.clip_eps_low, config.clip_eps_high)
    return torch.where(inputs.selected, torch.zeros_like(surrogate), surrogate)


@register_objective("kl_cov", strict=False, selection="kl_cov")
def kl_cov(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """``−A ρ`` plus ``κ |logprob − logprob_old|`` on the globally selected top-cov tokens."""
    penalty = config.kl_cov.coef * (inputs.logprob - inputs.old_logprob).abs()
    return -inputs.advantages * inputs.ratio + torch.where(
        inputs.selected, penalty, torch.zeros_like(penalty)
    )


@register_objective("neg_only", strict=True, balance="neg_only")
@register_objective("pos_only", strict=True, balance="pos_only")
@register_objective("static", strict=True, balance="static")
@register_objective("opefo", strict=True, balance="adaptive")
@register_objective("grpo_strict", strict=True)
def weighted_policy_gradient(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """Strict on-policy ``−w_t A_t logprob_t`` (ρ ≡ 1; spec §3, §5).

    The weights come from the method's balance: all 1 for ``grpo_strict``; ``1 ± λ*`` for
    ``opefo``; a fixed λ for ``static``; one side only for ``pos_only`` / ``neg_only``.
    """
    return -inputs.weight * inputs.advantages * inputs.logprob
