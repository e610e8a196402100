"""Triton device functions shared by the logits and the fused-linear kernels.

A tile is ``z`` ``[BLOCK_N, BLOCK_V]`` fp32 raw logits of ``BLOCK_N`` token rows and ``BLOCK_V``
vocabulary columns, ``−inf`` in the columns that are not real vocabulary (past the shard's
``valid`` columns). Per row the running state is the max ``m`` and the sums
``S0..S3`` of :mod:`opefo_nemo.kernels.partials`, each ``[BLOCK_N]`` fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_tile(z, m, s0, s1, s2, s3, inv_t, TABULAR: tl.constexpr):
    """Fold tile ``z`` into the running state; returns ``(m, s0, s1, s2, s3)``.

    The new max ``m' = max(m, max z)``; the sums so far move to it (``δ = (m − m')/T``,
    ``α = exp(δ)``: ``S0 ↦ α S0``, ``S1 ↦ α(S1 + δ S0)``, ``S2 ↦ α² S2``, ``S3 ↦ α²(S3 + δ S2)``),
    then the tile adds ``Σ e``, ``Σ e·d``, ``Σ e²``, ``Σ e²·d`` with ``d = (z − m')/T``,
    ``e = exp(d)``; a term with ``e = 0`` (``z = −inf``) adds 0, not ``0·(−inf)``.
    """
    new_m = tl.maximum(m, tl.max(z, axis=1))
    was_empty = m == float("-inf")
    delta = tl.where(was_empty, 0.0, (m - new_m) * inv_t)
    alpha = tl.where(was_empty, 0.0, tl.exp(delta))
    s1 = alpha * (s1 + delta * s0)
    s0 = alpha * s0
    base = tl.where(new_m == float("-inf"), 0.0, new_m)
    d = (z - base[:, None]) * inv_t
    e = tl.exp(d)
    s0 += tl.sum(e, axis=1)
    s1 += tl.sum(tl.where(e == 0.0, 0.0, e * d), axis=1)
    if TABULAR:
        alpha2 = alpha * alpha
        s3 = alpha2 * (s3 + delta * s2)
        s2 = alpha2 * s2
        e2 = e * e
        s2 += tl.sum(e2, axis=1)
        s3 += tl.sum(tl.where(e == 0.0, 0.0, e2 * d), axis=1)
    return new_m, s0, s1, s2, s3


@triton.jit
def count_bad(z):
    """Per row, how many entries of the tile are NaN or ``+inf`` (``[BLOCK_N]`` int32)."""
    bad = (z != z) | (z == float("inf"))
    return tl.sum(bad.to(tl.int32), axis=1)


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
