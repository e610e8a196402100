"""Triton kernels for the token statistics of one vocabulary shard of logits ``[tokens, width]``:
one read forward, one read and one write backward, no fp32 copy of the shard at any point
(docs/kernels.md, "``token_stats(kernel="triton")``").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from opefo_nemo.kernels.partials import SUM_COLUMNS, ShardPartials
from opefo_nemo.kernels.tiles import (
    count_bad,
    grad_tile,
    launch,
    load_row_stats,
    merge_tile,
    store_sums,
)

#: Widest vocabulary tile a program holds (fp32 registers per row).
MAX_BLOCK_V = 4096


@triton.jit
def _partials_kernel(
    logits_ptr,
    stride_row,
    target_ptr,
    max_ptr,
    sums_ptr,
    target_logit_ptr,
    bad_ptr,
    tokens,
    valid,
    inv_t,
    SQUARES: tl.constexpr,
    CUBES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < tokens
    cols = tl.arange(0, BLOCK_V)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s0 = tl.zeros((BLOCK_N,), tl.float32)
    s1 = tl.zeros((BLOCK_N,), tl.float32)
    s2 = tl.zeros((BLOCK_N,), tl.float32)
    s3 = tl.zeros((BLOCK_N,), tl.float32)
    s4 = tl.zeros((BLOCK_N,), tl.float32)
    s5 = tl.zeros((BLOCK_N,), tl.float32)
    bad = tl.zeros((BLOCK_N,), tl.int32)
    row_ptrs = logits_ptr + rows[:, None] * stride_row
    for start in range(0, valid, BLOCK_V):
        c = start + cols
        mask = row_ok[:, None] & (c[None, :] < valid)
        z = tl.load(row_ptrs + c[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        m, s0, s1, s2, s3, s4, s5 = merge_tile(z, m, s0, s1, s2, s3, s4, s5, inv_t, SQUARES, CUBES)
        bad += count_bad(z)
    target = tl.load(target_ptr + rows, mask=row_ok, other=-1)
    owned = row_ok & (target >= 0)
    z_y = tl.load(logits_ptr + rows * stride_row + target, mask=owned, other=0.0).to(tl.float32)
    tl.store(max_ptr + rows, m, mask=row_ok)
    store_sums(sums_ptr, rows, row_ok, s0, s1, s2, s3, s4, s5)
    tl.store(target_logit_ptr + rows, z_y, mask=row_ok)
    tl.store(bad_ptr + rows, bad, mask=row_ok)


@triton.jit
def _grad_kernel(
    logits_ptr,
    grad_ptr,
    stride_row,
    grad_stride_row,
    target_ptr,
    row_stats_ptr,
    tokens,
    valid,
    width,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < tokens
    cols = tl.arange(0, BLOCK_V)
    target = tl.load(target_ptr + rows, mask=row_ok, other=-1)
    m, log_s0, entropy, g_l, g_h = load_row_stats(row_stats_ptr, rows, row_ok)
    for start in range(0, width, BLOCK_V):
        c = start + cols
        real = row_ok[:, None] & (c[None, :] < valid)
        z = tl.load(
            logits_ptr + rows[:, None] * stride_row + c[None, :], mask=real, other=float("-inf")
        ).to(tl.float32)
        grad = grad_tile(z, c, target, m, log_s0, entropy, g_l, g_h, inv_t)
        grad = tl.where(real, grad, 0.0)
        out = grad_ptr + rows[:, None] * grad_stride_row + c[None, :]
        tl.store(
            out, grad.to(grad_ptr.dtype.element_ty), mask=row_ok[:, None] & (c[None, :] < width)
        )


def default_block_v(valid: int) -> int:
    """The vocabulary tile: the shard's real width rounded up to a power of two, 16 to
    :data:`MAX_BLOCK_V`."""
    return min(MAX_BLOCK_V, max(16, triton.next_power_of_2(max(valid, 1))))


def _rows_last_contiguous(logits: Tensor) -> Tensor:
    if logits.dim() != 2:
        raise ValueError(f"expected logits [tokens, width], got shape {tuple(logits.shape)}")
    return logits if logits.stride(1) == 1 else logits.contiguous()


def shard_partials(
    logits: Tensor,
    local_target: Tensor,
    valid: int,
    inv_t: float,
    powers: tuple[int, ...],
    *,
    block_n: int = 1,
    block_v: int | None = None,
    num_warps: int = 4,
) -> ShardPartials:
    """One read of ``logits`` ``[tokens, width]`` (columns ``>= valid`` are padding, never read).

    ``local_target`` ``[tokens]`` int64: the target's column in this shard, −1 where another
    shard owns it. ``inv_t`` = 1/T. ``powers`` (a subset of ``(2, 3)``): which pairs
    ``Σ e^k``, ``Σ e^k·d`` beyond ``k = 1`` to compute (:mod:`.partials`); the others stay 0.
    The default tiles (one row, 4096 columns, 4 warps per program) were the fastest of the
    variants ``benchmarks/kernel_sweep.py`` tried on an H200.
    """
    logits = _rows_last_contiguous(logits)
    tokens = logits.shape[0]
    device = logits.device
    out = ShardPartials(
        local_max=torch.empty(tokens, dtype=torch.float32, device=device),
        sums=torch.zeros(tokens, SUM_COLUMNS, dtype=torch.float32, device=device),
        target_logit=torch.empty(tokens, dtype=torch.float32, device=device),
        bad=torch.empty(tokens, dtype=torch.int32, device=device),
    )
    if tokens == 0:
        return ShardPartials(out.local_max, out.sums, out.target_logit, out.bad.bool())
    block_v = block_v or default_block_v(valid)
    launch(_partials_kernel, (triton.cdiv(tokens, block_n),))(
        logits,
        logits.stride(0),
        local_target.contiguous(),
        out.local_max,
        out.sums,
        out.target_logit,
        out.bad,
        tokens,
        valid,
        float(inv_t),
        SQUARES=2 in powers,
        CUBES=3 in powers,
        BLOCK_N=block_n,
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return ShardPartials(out.local_max, out.sums, out.target_logit, out.bad > 0)


def shard_logits_grad(
    logits: Tensor,
    local_target: Tensor,
    valid: int,
    inv_t: float,
    row_stats: Tensor,
    *,
    out: Tensor | None = None,
    block_n: int = 1,
    block_v: int | None = None,
    num_warps: int = 8,
) -> Tensor:
    """The gradient ``[tokens, width]`` in the logits' dtype (columns ``>= valid`` are 0),
    written into ``out`` (same shape and dtype, unit column stride) or a new tensor.

    ``row_stats`` ``[tokens, 5]`` fp32: global row max (raw), ``log S0``, ``H``, ``g_l``, ``g_H``
    (the incoming gradients of ``logprob`` and ``entropy``, 0 where absent). The default 8 warps
    per program ran at 91 % of the copy bandwidth on an H200 where 4 ran at 88 %
    (``benchmarks/kernel_sweep.py``).
    """
    logits = _rows_last_contiguous(logits)
    tokens, width = logits.shape
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if out is None else out
    if grad.shape != logits.shape or grad.dtype != logits.dtype or grad.stride(1) != 1:
        raise ValueError(
            f"out must be [tokens, width] {logits.dtype} with unit column stride, got "
            f"{tuple(grad.shape)} {grad.dtype} strides {grad.stride()}"
        )
    if tokens == 0 or width == 0:
        return grad.zero_()
    block_v = block_v or default_block_v(width)
    launch(_grad_kernel, (triton.cdiv(tokens, block_n),))(
        logits,
        grad,
        logits.stride(0),
        grad.stride(0),
        local_target.contiguous(),
        row_stats.contiguous(),
        tokens,
        valid,
        width,
        float(inv_t),
        BLOCK_N=block_n,
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return grad
