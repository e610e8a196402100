"""On-policy fidelity (spec §6): how far the trainer's log-probabilities of the sampled tokens are
from the rollout engine's, which sampled them with its own kernels and precision; the definitions
of the ``fidelity/*`` metrics are spec §6's. Sums are float64 and add over chunks and ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from opefo_nemo.core.tensor_checks import as_bool_mask, check_finite, check_same_shape

DEFAULT_THRESHOLD = 0.2


@torch.no_grad()
def fidelity_sums(
    train_logprob: Tensor, rollout_logprob: Tensor, mask: Tensor, threshold: float
) -> dict[str, Tensor]:
    """Local sums over ``mask`` of ``[*]`` tensors (0-d float64 each) of
    ``Δ_t = log π_train(y_t) − log π_rollout(y_t)``: token count, ``|Δ_t|``, ``e^{Δ_t} − 1 − Δ_t``
    (an unbiased, non-negative estimate of ``KL(π_rollout ‖ π_train)`` from the rollout's
    samples), ``e^{|Δ_t|}`` and the tokens with ``|Δ_t| > threshold``; add them over chunks and
    ranks, then :func:`fidelity_metrics`."""
    check_same_shape("train_logprob", train_logprob, rollout_logprob=rollout_logprob, mask=mask)
    valid = as_bool_mask(mask)
    delta = train_logprob.double() - rollout_logprob.double()
    delta = torch.where(valid, delta, torch.zeros_like(delta))
    check_finite("train_logprob - rollout_logprob", delta)
    magnitude = delta.abs()
    return {
        "tokens": valid.sum().double(),
        "abs_diff": magnitude.sum(),
        "kl": (torch.expm1(delta) - delta).sum(),
        "mult_error": (magnitude.exp() * valid).sum(),
        "beyond": (valid & (magnitude > threshold)).sum().double(),
    }


def fidelity_metrics(sums: Mapping[str, Tensor | float]) -> dict[str, float]:
    """The ``fidelity/*`` figures from the summed :func:`fidelity_sums`."""
    n = float(sums["tokens"])
    if n == 0:
        raise ValueError("fidelity metrics of a batch without response tokens")
    return {
        "fidelity/abs_logprob_diff": float(sums["abs_diff"]) / n,
        "fidelity/kl": float(sums["kl"]) / n,
        "fidelity/mult_prob_error": float(sums["mult_error"]) / n,
        "fidelity/frac_beyond": float(sums["beyond"]) / n,
    }


@torch.no_grad()
def truncated_is_weight(train_logprob: Tensor, rollout_logprob: Tensor, cap: float) -> Tensor:
    """``min(π_train / π_rollout, cap) = min(e^{Δ_t}, cap)`` per token, fp32 ``[*]``, without
    gradient: corrects the strict methods' gradient for the mismatch when asked."""
    check_same_shape("train_logprob", train_logprob, rollout_logprob=rollout_logprob)
    delta = train_logprob.double() - rollout_logprob.double()
    return delta.exp().clamp(max=cap).float()
