"""The per-token losses ``ℓ_t`` of SPEC §5, one registered function per method.

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


def weighted_policy_gradient(inputs: LossInputs) -> Tensor:
    """Strict on-policy term ``−w_t A_t logprob_t`` (ρ ≡ 1; SPEC §3, §5)."""
    return -inputs.weight * inputs.advantages * inputs.logprob


@register_objective("grpo", strict=False)
def grpo(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """GRPO with ratio clipping (paper: ε 0.2/0.2, 8 updates per rollout)."""
    return clipped_surrogate(inputs, config.clip_eps_low, config.clip_eps_high)


@register_objective("clip_higher", strict=False)
def clip_higher(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """GRPO with a relaxed upper bound (paper: ε_low 0.2, ε_high 0.28)."""
    return clipped_surrogate(inputs, config.clip_eps_low, config.clip_eps_high)


@register_objective("entropy_reg", strict=False, entropy_grad=True)
def entropy_reg(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """GRPO minus ``β H_t`` with the entropy differentiated (paper: β = 0.01)."""
    if inputs.entropy is None:
        raise ValueError("entropy_reg needs the entropy with gradient in the update pass")
    surrogate = clipped_surrogate(inputs, config.clip_eps_low, config.clip_eps_high)
    return surrogate - config.entropy_coef * inputs.entropy


@register_objective("clip_cov", strict=False, selection="clip_cov")
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


@register_objective("grpo_strict", strict=True)
def grpo_strict(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """Strict on-policy GRPO ``−A_t logprob_t`` (weights are all 1: balance ``none``)."""
    return weighted_policy_gradient(inputs)


@register_objective("opefo", strict=True, balance="adaptive")
def opefo(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """OPEFO: ``−w_t A_t logprob_t`` with ``w = 1 ± λ*`` (zero first-order entropy flow)."""
    return weighted_policy_gradient(inputs)


@register_objective("static", strict=True, balance="static")
def static(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """Ablation: a fixed λ (``entropy_flow.static_lambda``) instead of λ*."""
    return weighted_policy_gradient(inputs)


@register_objective("pos_only", strict=True, balance="pos_only")
def pos_only(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """Ablation: only the entropy-increasing side is rescaled, by ``1 + λ*``."""
    return weighted_policy_gradient(inputs)


@register_objective("neg_only", strict=True, balance="neg_only")
def neg_only(inputs: LossInputs, config: MethodConfig) -> Tensor:
    """Ablation: only the entropy-decreasing side is rescaled, by ``1 − λ*``."""
    return weighted_policy_gradient(inputs)
