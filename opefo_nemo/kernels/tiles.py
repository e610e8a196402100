"""Triton device functions shared by the logits and the fused-linear kernels: a tile is ``z``
``[BLOCK_N, BLOCK_V]`` fp32 raw logits, ``−inf`` past the shard's ``valid`` columns; per row the
running max ``m`` and the sums ``S0..S5`` of :mod:`opefo_nemo.kernels.partials`, ``[BLOCK_N]`` fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl


def launch(kernel: Any, grid: tuple[int, ...]) -> Callable[..., None]:
    """``kernel[grid]``: Triton's launcher, which takes plain Python values for the kernel's
    ``tl.constexpr`` parameters and launch options such as ``num_warps`` (the kernel's own
    annotations, ``tl.constexpr``, do not describe what a caller passes)."""
    return kernel[grid]


@triton.jit
def _merge_power(s_k, s_kd, alpha_k, delta, e_k, d):
    """Move one power's running sums ``Σ e^k``, ``Σ e^k·d`` to the new max and add the tile's
    ``e^k`` ``[BLOCK_N, BLOCK_V]``; terms with ``e = 0`` add 0, not ``0·(−inf)``."""
    s_kd = alpha_k * (s_kd + delta * s_k) + tl.sum(tl.where(e_k == 0.0, 0.0, e_k * d), axis=1)
    s_k = alpha_k * s_k + tl.sum(e_k, axis=1)
    return s_k, s_kd


@triton.jit
def merge_tile(z, m, s0, s1, s2, s3, s4, s5, inv_t, SQUARES: tl.constexpr, CUBES: tl.constexpr):
    """Fold tile ``z`` into the running state; returns ``(m, s0, s1, s2, s3, s4, s5)``.

    The new max ``m' = max(m, max z)``; the sums so far move to it (``δ = (m − m')/T``,
    ``α = exp(δ)``: ``Σ e^k ↦ α^k Σ e^k``, ``Σ e^k·d ↦ α^k (Σ e^k·d + δ Σ e^k)``), then the tile
    adds ``Σ e^k``, ``Σ e^k·d`` with ``d = (z − m')/T``, ``e = exp(d)``: ``k = 1`` always
    (``s0``, ``s1``), ``k = 2`` with ``SQUARES`` (``s2``, ``s3``), ``k = 3`` with ``CUBES``
    (``s4``, ``s5``); the others are returned unchanged.
    """
    new_m = tl.maximum(m, tl.max(z, axis=1))
    was_empty = m == float("-inf")
    delta = tl.where(was_empty, 0.0, (m - new_m) * inv_t)
    alpha = tl.where(was_empty, 0.0, tl.exp(delta))
    base = tl.where(new_m == float("-inf"), 0.0, new_m)
    d = (z - base[:, None]) * inv_t
    e = tl.exp(d)  # type: ignore[var-annotated, unused-ignore]  # untyped triton.language, per mypy cache
    s0, s1 = _merge_power(s0, s1, alpha, delta, e, d)
    if SQUARES:
        s2, s3 = _merge_power(s2, s3, alpha * alpha, delta, e * e, d)
    if CUBES:
        s4, s5 = _merge_power(s4, s5, alpha * alpha * alpha, delta, e * e * e, d)
    return new_m, s0, s1, s2, s3, s4, s5


@triton.jit
def store_sums(sums_ptr, rows, row_ok, s0, s1, s2, s3, s4, s5):
    """Write the running sums into the row-major ``[tokens, 6]`` fp32 buffer at ``sums_ptr``."""
    out = sums_ptr + rows * 6
    tl.store(out, s0, mask=row_ok)
    tl.store(out + 1, s1, mask=row_ok)
    tl.store(out + 2, s2, mask=row_ok)
    tl.store(out + 3, s3, mask=row_ok)
    tl.store(out + 4, s4, mask=row_ok)
    tl.store(out + 5, s5, mask=row_ok)


@triton.jit
def count_bad(z):
    """Per row, how many entries of the tile are NaN or ``+inf`` (``[BLOCK_N]`` int32)."""
    bad = (z != z) | (z == float("inf"))
    return tl.sum(bad.to(tl.int32), axis=1)


@triton.jit
def load_row_stats(row_stats_ptr, rows, row_ok):
    """The gradient kernels' per-row inputs ``(m, log S0, H, g_l, g_H)``, each ``[BLOCK_N]`` fp32,
    from the row-major ``[tokens, 5]`` buffer ``parallel/triton_stats.py``'s ``row_stats``
    packs: row ``r`` holds its five values at ``5r`` to ``5r + 4``; 0 outside ``row_ok``."""
    row = row_stats_ptr + rows * 5
    m = tl.load(row, mask=row_ok, other=0.0)
    log_s0 = tl.load(row + 1, mask=row_ok, other=0.0)
    entropy = tl.load(row + 2, mask=row_ok, other=0.0)
    g_l = tl.load(row + 3, mask=row_ok, other=0.0)
    g_h = tl.load(row + 4, mask=row_ok, other=0.0)
    return m, log_s0, entropy, g_l, g_h


@triton.jit
def grad_tile(z, cols, target, m, log_s0, entropy, g_l, g_h, inv_t):
    """``∂(g_l·logprob + g_H·H)/∂z`` for the tile, fp32 ``[BLOCK_N, BLOCK_V]``:
    ``(g_l onehot(y) − p (g_l + g_H (log p + H))) / T`` with ``log p = (z − m)/T − log S0``.

    ``cols`` ``[BLOCK_V]`` are the tile's local column indices, ``target`` ``[BLOCK_N]`` the
    local target column (−1 where another shard owns it); the row vectors are ``[BLOCK_N]`` fp32.
    Columns with ``z = −inf`` get 0 (``p log p`` taken as 0 where ``p = 0``).
    """
    log_p = (z - m[:, None]) * inv_t - log_s0[:, None]
    p = tl.exp(log_p)
    p_log_p = tl.where(p == 0.0, 0.0, p * log_p)
    grad = -(p * (g_l + g_h * entropy)[:, None] + g_h[:, None] * p_log_p)
    grad = tl.where(cols[None, :] == target[:, None], grad + g_l[:, None], grad)
    return grad * inv_t


@triton.jit
def dot_acc(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b`` in fp32. ``UPCAST``: multiply as fp32 (exact for bf16/fp16 operands, whose
    products fit fp32's mantissa); used under Triton's interpreter, whose bf16 ``tl.dot`` is
    wrong (Triton 3.9), so the CPU tests see the GPU's arithmetic up to summation order."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc
