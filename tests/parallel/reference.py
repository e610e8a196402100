"""Independent full-vocabulary references for the token statistics (spec §1), in float64."""

from __future__ import annotations

import torch
from torch import Tensor


def reference_stats(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> dict[str, Tensor]:
    """``logprob``, ``entropy`` and the vocabulary sums ``Σ p^k``, ``Σ p^k log p`` (k = 2, 3) of
    ``softmax(logits / T)`` in float64.

    ``logits`` ``[*, V]`` hold the real vocabulary only (no padding); results ``[*]``.
    Differentiable w.r.t. ``logits`` if it requires grad.
    """
    log_p = torch.log_softmax(logits.double() / temperature, dim=-1)
    p = log_p.exp()
    return {
        "logprob": log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1),
        "entropy": -(p * log_p).sum(-1),
        "sum_p2": (p * p).sum(-1),
        "sum_p2_logp": (p * p * log_p).sum(-1),
        "sum_p3": (p * p * p).sum(-1),
        "sum_p3_logp": (p * p * p * log_p).sum(-1),
    }


def reference_grads(
    logits: Tensor, targets: Tensor, temperature: float, g_logprob: Tensor, g_entropy: Tensor
) -> Tensor:
    """``∂(Σ g_l·logprob + Σ g_H·entropy)/∂logits`` by float64 autograd on the full vocabulary."""
    full = logits.detach().double().requires_grad_()
    ref = reference_stats(full, targets, temperature)
    loss = (ref["logprob"] * g_logprob.double()).sum() + (ref["entropy"] * g_entropy.double()).sum()
    (grad,) = torch.autograd.grad(loss, full)
    return grad
