"""Phase 3 of a step: the policy loss of one micro-batch as its share of the global token mean.

spec §5: ``L = Σ_t mask_t ℓ_t / N_tokens_global``; every micro-batch contributes its partial sum
divided by the *global* count, so gradients accumulated over micro-batches and averaged over
data-parallel ranks equal the full-batch gradient (an engine whose framework averages over
micro-batches or ranks must undo that scaling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..validation import as_bool_mask, check_finite, check_same_shape
from .config import MethodConfig
from .registry import get_objective
from .tokens import Coefficients, LossInputs

#: The keys of :attr:`LossOutput.sums`, in this order (engines reduce them as one vector).
LOSS_SUMS = ("loss", "clip_upper", "clip_lower", "dh_upper", "dh_lower", "selected")


@dataclass(frozen=True)
class LossOutput:
    """``loss``: 0-d, differentiable share of the global mean. ``sums``: 0-d float64 metric
    numerators of this micro-batch (add them over micro-batches and ranks, then
    :func:`opefo_nemo.core.metrics.loss_metrics`)."""

    loss: Tensor
    sums: dict[str, Tensor]


def policy_loss(
    config: MethodConfig,
    logprob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    coefficients: Coefficients,
    n_tokens: int,
    *,
    old_logprob: Tensor | None = None,
    entropy: Tensor | None = None,
) -> LossOutput:
    """The micro-batch's share of the step loss, for the method named by ``config``.

    ``logprob`` ``[*]``: with gradient. ``old_logprob``: the rollout policy's (multi-update
    baselines); ``None`` means strict on-policy, ``logprob.detach()``, so ρ ≡ 1. ``entropy``: with
    gradient, required by objectives that differentiate it. ``n_tokens``: the global count from
    :func:`~opefo_nemo.core.objectives.prepare.prepare`.
    """
    objective = get_objective(config.name)
    check_same_shape(
        "logprob",
        logprob,
        advantages=advantages,
        mask=mask,
        old_logprob=old_logprob,
        entropy=entropy,
        delta_h=coefficients.delta_h,
        weight=coefficients.weight,
        selected=coefficients.selected,
    )
    check_finite("logprob", logprob)
    check_finite("advantages", advantages)
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be the positive global token count, got {n_tokens}")
    if old_logprob is not None and objective.strict:
        raise ValueError(f"{config.name!r} is strict on-policy: pass old_logprob=None (ρ ≡ 1)")
    valid = as_bool_mask(mask)
    inputs = LossInputs(
        logprob=logprob,
        old_logprob=logprob.detach() if old_logprob is None else old_logprob.detach(),
        advantages=advantages.detach(),
        weight=coefficients.weight,
        selected=coefficients.selected,
        entropy=entropy,
    )
    per_token = objective.token_loss(inputs, config)
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    loss = per_token.sum() / n_tokens
    sums = _loss_sums(inputs, valid, per_token, coefficients.delta_h, config, objective.ratio_clip)
    return LossOutput(loss, sums)


@torch.no_grad()
def _loss_sums(
    inputs: LossInputs,
    valid: Tensor,
    per_token: Tensor,
    delta_h: Tensor,
    config: MethodConfig,
    ratio_clip: bool,
) -> dict[str, Tensor]:
    """Clip counts and the ΔH of clipped tokens (spec §6, the paper's Fig. 2c), loss numerator.

    ``ratio_clip``: the method's loss clips the ratio; if not (KL-Cov's ``−A ρ``), no token is
    clipped, whatever ρ is.
    """
    clipping = valid if ratio_clip else torch.zeros_like(valid)
    ratio = inputs.ratio.detach()
    adv = inputs.advantages
    upper = clipping & (adv > 0) & (ratio > 1 + config.clip_eps_high)
    lower = clipping & (adv < 0) & (ratio < 1 - config.clip_eps_low)
    dh = delta_h.double()
    return {
        "loss": per_token.detach().double().sum(),
        "clip_upper": upper.sum().double(),
        "clip_lower": lower.sum().double(),
        "dh_upper": (dh * upper).sum(),
        "dh_lower": (dh * lower).sum(),
        "selected": (inputs.selected & valid).sum().double(),
    }
