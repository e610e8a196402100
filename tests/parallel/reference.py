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


def brute_force_rows(logits: Tensor, temperature: float) -> dict[str, Tensor]:
    """Token by token, an explicit float64 softmax over the real vocabulary of ``logits``
    ``[tokens, V]``: ``entropy``, the four vocabulary sums, and the literal expectation
    ``Σ_a π(a)(1 − π(a))² (log π(a) + H)`` (spec §2), each ``[tokens]`` float64."""
    rows: dict[str, list[float]] = {}
    for row in logits.detach().double():
        shifted = row / temperature - (row / temperature).max()
        log_p = shifted - torch.log(torch.exp(shifted).sum())
        p = torch.exp(log_p)
        h = float(-(p * log_p).sum())
        values = {
            "entropy": h,
            "sum_p2": float((p**2).sum()),
            "sum_p2_logp": float((p**2 * log_p).sum()),
            "sum_p3": float((p**3).sum()),
            "sum_p3_logp": float((p**3 * log_p).sum()),
            "expectation": float((p * (1 - p) ** 2 * (log_p + h)).sum()),
        }
        for name, value in values.items():
            rows.setdefault(name, []).append(value)
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in rows.items()}


def assert_stats_within_bounds(
    stats, ref: dict[str, Tensor], logits64: Tensor, temperature: float, where: str = ""
) -> None:
    """Every field of ``ref`` of ``stats`` (``[*]``, flattened) within the fp32 error model of
    ``tests/kernels/tolerances.py`` for the float64 real-vocabulary ``logits64`` ``[tokens, V]``:
    the row budget times ``1 + |ref|``, so a sum near 0 (``sum_p2_logp``) is bounded by its
    terms' magnitude, a large ``|logprob|`` relatively."""
    from tests.kernels.tolerances import row_eps, stats_tol

    eps = row_eps(logits64.double(), temperature)
    for name, want in ref.items():
        got = getattr(stats, name).reshape(-1).double()
        bound = stats_tol(eps, want.reshape(-1))
        excess = float(((got - want.reshape(-1)).abs() - bound).max())
        assert excess <= 0, f"{where} {name}: beyond the fp32 error bound by {excess:.3g}"


def assert_grad_within_bound(
    grad: Tensor, logits64: Tensor, targets: Tensor, temperature: float, g_l, g_h, where=""
) -> None:
    """``grad`` ``[tokens, V]`` (the real columns) against :func:`reference_grads` within the
    fp32 error model of ``tests/kernels/tolerances.py`` plus one rounding to ``grad``'s dtype."""
    from tests.kernels.tolerances import logits_grad_bound

    ref = reference_grads(logits64, targets, temperature, g_l, g_h)
    bound = logits_grad_bound(logits64.double(), targets, temperature, g_l, g_h, grad.dtype, ref)
    excess = float(((grad.double() - ref).abs() - bound).max())
    assert excess <= 0, f"{where}: gradient beyond the error bound by {excess:.3g}"
