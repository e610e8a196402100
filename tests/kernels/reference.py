"""Float64 full-vocabulary references that allow masked (``−inf``) logits.

``H = log S − Σ p·d`` and ``Σ p^k log p = Σ p^k (d − log S)`` with ``d = z/T`` set to 0 where
``z = −inf`` (there ``p = 0``): no ``0·(−inf)``, and autograd stays finite.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reference_stats(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> dict[str, Tensor]:
    """``logprob``, ``entropy``, ``sum_p2``, ``sum_p2_logp``, ``sum_p3``, ``sum_p3_logp`` of
    ``softmax(logits / T)``, float64
    ``[tokens]``; ``logits`` ``[tokens, V]`` (real vocabulary only), differentiable."""
    d = logits.double() / temperature
    log_s = torch.logsumexp(d, dim=-1)
    p = torch.exp(d - log_s[:, None])
    safe = torch.where(torch.isfinite(d), d, 0.0)
    p2, p3 = p * p, p * p * p
    return {
        "logprob": d.gather(1, targets[:, None]).squeeze(1) - log_s,
        "entropy": log_s - (p * safe).sum(-1),
        "sum_p2": p2.sum(-1),
        "sum_p2_logp": (p2 * (safe - log_s[:, None])).sum(-1),
        "sum_p3": p3.sum(-1),
        "sum_p3_logp": (p3 * (safe - log_s[:, None])).sum(-1),
    }


def reference_grads(
    logits: Tensor, targets: Tensor, temperature: float, g_logprob: Tensor, g_entropy: Tensor
) -> Tensor:
    """``∂(Σ g_l·logprob + Σ g_H·entropy)/∂logits`` by float64 autograd."""
    full = logits.detach().double().requires_grad_()
    ref = reference_stats(full, targets, temperature)
    loss = (ref["logprob"] * g_logprob.double()).sum() + (ref["entropy"] * g_entropy.double()).sum()
    (grad,) = torch.autograd.grad(loss, full)
    return grad


def assert_only_requested_powers(some: Tensor, both: Tensor, powers: tuple[int, ...]) -> None:
    """Partial sums ``[rows, 6]`` (pairs ``Σ e^k``, ``Σ e^k·d`` for ``k = 1, 2, 3``) of a kernel
    asked for ``powers`` (``some``) against the same kernel asked for ``(2, 3)`` (``both``): the
    pairs of ``k = 1`` and of the powers asked for are the same bits, the others stay 0, and
    ``both`` has non-zero higher powers (so the comparison is not vacuous)."""
    for k in (1, 2, 3):
        pair = slice(2 * k - 2, 2 * k)
        if k == 1 or k in powers:
            assert torch.equal(some[:, pair], both[:, pair]), k
        else:
            assert bool((some[:, pair] == 0).all()), k
    assert bool((both[:, 2:] > 0).any())
