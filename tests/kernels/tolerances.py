"""Error bounds for fp32 token statistics against float64, derived per element.

Notation: ``u`` the unit round-off of fp32 (2⁻²⁴); ``V`` the real vocabulary; for a row,
``d_max = max_a |z_a − m| / T`` (the largest shifted logit, which bounds ``|log p|`` up to
``log V``). Sums of ``n`` terms in fp32 carry at most ``n·u`` relative error (sequential
worst case, Higham's γ_n); each term ``e = exp(d)`` and its products carry a few roundings and
inherit the rounding of ``d`` itself, ``|d|·u``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from opefo_nemo.kernels import triton_interpreted

U32 = 2.0**-24

#: Relative error of storing an fp32 value in a dtype from a kernel: half an ulp (round to
#: nearest) on a GPU; Triton's interpreter converts fp32 to bf16 by truncation, a whole ulp.
UNIT = {
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-7 if triton_interpreted() else 2.0**-8,
    torch.float16: 2.0**-11,
}


def row_eps(z64: Tensor, temperature: float) -> Tensor:
    """Relative error budget ``[tokens]`` of one row's fp32 statistics: ``8u (V + d_max + 1)``
    (8 roundings per term covers shift, scale, exp, product and the final combination; ``V`` the
    summation; ``d_max`` the rounding of the shifted logits). ``z64`` ``[tokens, V]`` float64 of
    the real columns, ``−inf`` allowed."""
    finite = torch.isfinite(z64)
    high = torch.where(finite, z64, float("-inf")).amax(1)
    low = torch.where(finite, z64, float("inf")).amin(1)
    return 8 * U32 * (z64.shape[1] + (high - low) / temperature + 1)


def stats_tol(eps: Tensor, ref: Tensor) -> Tensor:
    """Bound on ``|statistic − ref|``: the row budget times ``1 + |ref|`` (absolute for values
    near 0, such as ``sum_p2``, relative for large ones, such as the ``logprob`` of an unlikely
    token)."""
    return eps * (1 + ref.abs())


def grad_scale(z64: Tensor, targets: Tensor, temperature: float, g_l: Tensor, g_h: Tensor):
    """``M`` ``[tokens, V]``: the sum of the magnitudes of the terms of the logit gradient
    ``(g_l onehot(y) − p (g_l + g_H (log p + H))) / T``; an fp32 rounding of relative size ``ε``
    in each term moves the gradient by at most ``ε·M``."""
    log_p = torch.log_softmax(z64 / temperature, dim=1)
    p = log_p.exp()
    entropy = -(torch.where(p > 0, p * log_p, 0.0)).sum(1, keepdim=True)
    p_log_p = torch.where(p > 0, p * log_p.abs(), 0.0)
    g_l, g_h = g_l.double()[:, None].abs(), g_h.double()[:, None].abs()
    terms = p * (g_l + g_h * entropy) + g_h * p_log_p
    terms = terms.scatter_add(1, targets[:, None], g_l)
    return terms / temperature


def logits_grad_bound(
    z64: Tensor, targets: Tensor, temperature: float, g_l: Tensor, g_h: Tensor, dtype, ref: Tensor
) -> Tensor:
    """Bound ``[tokens, V]`` on a logits kernel's gradient against float64 ``ref``: the row
    budget times the terms' magnitudes (fp32 arithmetic) plus one rounding to ``dtype``."""
    terms = grad_scale(z64, targets, temperature, g_l, g_h)
    return row_eps(z64, temperature)[:, None] * terms + UNIT[dtype] * ref.abs()


def fused_row_eps(x64: Tensor, w64: Tensor, temperature: float) -> Tensor:
    """Row budget ``[tokens]`` of the fused output-layer kernel: :func:`row_eps` of
    ``z = x64 @ w64ᵀ`` (real vocabulary rows of the weight) plus ``4δ/T``, with
    ``δ = (h + 1)·u·max_a Σ_k |x_k w_ak|`` the fp32 rounding of a logit formed in the kernel (bf16
    and fp16 products are exact in fp32; a shift ``δ`` moves ``log p`` by at most ``2δ/T``)."""
    delta = (x64.shape[1] + 1) * U32 * (x64.abs() @ w64.abs().T).amax(1)
    return row_eps(x64 @ w64.T, temperature) + 4 * delta / temperature


def fused_grad_bounds(
    x64: Tensor,
    w64: Tensor,
    targets: Tensor,
    temperature: float,
    g_l: Tensor,
    g_h: Tensor,
    dtype,
    refs: tuple[Tensor, Tensor],
) -> tuple[Tensor, Tensor]:
    """Bounds on the fused kernel's ``(∂/∂hidden, ∂/∂weight)`` against the float64 ``refs``: the
    terms of ``∂L/∂z`` carry the row budget plus the rounding of ``∂L/∂z`` to ``dtype`` before
    the matmuls, each matmul adds ``(V + N)·u`` of its magnitudes, each result one rounding to
    ``dtype``."""
    tokens, vocab = x64.shape[0], w64.shape[0]
    eps = fused_row_eps(x64, w64, temperature) + (vocab + tokens) * U32
    eps = eps + (UNIT[dtype] if dtype != torch.float32 else 0)
    scale = eps[:, None] * grad_scale(x64 @ w64.T, targets, temperature, g_l, g_h)
    bound_x = scale @ w64.abs() + UNIT[dtype] * refs[0].abs()
    bound_w = scale.T @ x64.abs() + UNIT[dtype] * refs[1].abs()
    return bound_x, bound_w
