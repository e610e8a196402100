"""Phase 3 of a step: the policy loss of one micro-batch as its share of the global token mean
(spec §5), so accumulated and DP-averaged gradients equal the full-batch gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from opefo_nemo.core.objectives.base import Objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs
from opefo_nemo.core.tensor_checks import as_bool_mask, check_finite, check_same_shape


@dataclass(frozen=True)
class LossOutput:
    """``loss``: 0-d, differentiable share of the global mean. ``sums``: 0-d float64 metric
    numerators of this micro-batch, keys :func:`loss_sum_names` (add them over micro-batches and
    ranks, then :func:`step_loss_metrics`)."""

    loss: Tensor
    sums: dict[str, Tensor]


def loss_sum_names(objective: Objective) -> tuple[str, ...]:
    """The keys of every :attr:`LossOutput.sums` of ``objective``, in a fixed order (engines
    reduce them as one vector)."""
    return ("loss", *objective.loss_sum_names)


def policy_loss(
    objective: Objective,
    logprob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    coefficients: Coefficients,
    n_tokens: int,
    *,
    old_logprob: Tensor | None = None,
    entropy: Tensor | None = None,
) -> LossOutput:
    """The micro-batch's share of the step loss of ``objective``: ``Σ_t mask_t ℓ_t / n_tokens``
    with the *global* count (spec §5: ``L = Σ_t mask_t ℓ_t / N_tokens_global``); an engine whose
    framework averages over micro-batches or ranks must undo that scaling.

    ``logprob`` ``[*]``: with gradient. ``old_logprob``: the rollout policy's (multi-update
    baselines); ``None`` means strict on-policy, ``logprob.detach()``, so ρ ≡ 1. ``entropy``: with
    gradient, required by objectives that differentiate it. ``n_tokens``: the global count from
    :func:`~opefo_nemo.core.objectives.prepare.prepare`.
    """
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
    name = objective.config.name
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be the positive global token count, got {n_tokens}")
    if old_logprob is not None and objective.strict:
        raise ValueError(f"{name!r} is strict on-policy: pass old_logprob=None (ρ ≡ 1)")
    if objective.differentiates_entropy and entropy is None:
        raise ValueError(f"{name!r} needs the entropy with gradient in the update pass")
    valid = as_bool_mask(mask)
    inputs = LossInputs(
        logprob=logprob,
        old_logprob=logprob.detach() if old_logprob is None else old_logprob.detach(),
        advantages=advantages.detach(),
        weight=coefficients.weight,
        selected=coefficients.selected,
        entropy=entropy,
    )
    per_token = objective.token_loss(inputs)
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    loss = per_token.sum() / n_tokens
    with torch.no_grad():
        own = objective.loss_sums(inputs, valid, coefficients.delta_h)
    if set(own) != set(objective.loss_sum_names):
        raise ValueError(
            f"method {name!r} returned loss sums {sorted(own)}, declared "
            f"{sorted(objective.loss_sum_names)}"
        )
    return LossOutput(loss, {"loss": per_token.detach().double().sum(), **own})


def step_loss_metrics(
    objective: Objective, sums: Mapping[str, float], n_tokens: int
) -> dict[str, float]:
    """``loss`` (the global token mean, spec §5) and the objective's own metrics from the sums
    of every micro-batch and rank."""
    return {"loss": float(sums["loss"]) / n_tokens, **objective.loss_metrics(sums, n_tokens)}
