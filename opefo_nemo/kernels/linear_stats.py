"""Triton kernels for the token statistics straight from hidden states and the output weight: each
logit tile is accumulated in fp32 registers and used at once, so the ``[tokens, width]`` logits
never reach memory (docs/kernels.md, "``linear_token_stats``": the math, the backward's chunks and
the precision).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from opefo_nemo.kernels import budgets
from opefo_nemo.kernels.partials import SUM_COLUMNS, ShardPartials
from opefo_nemo.kernels.select import triton_interpreted
from opefo_nemo.kernels.tiles import (
    count_bad,
    dot_acc,
    grad_tile,
    launch,
    load_row_stats,
    merge_tile,
    store_sums,
)


@dataclass(frozen=True)
class LinearBlocks:
    """Tile sizes (powers of two, each ≥ 16 for ``tl.dot``) and warps per program."""

    n: int = 64
    v: int = 128
    k: int = 64
    num_warps: int = 8


#: The forward's tiles: the fastest of the variants ``benchmarks/kernel_sweep.py`` tried on an H200
#: (benchmarks/results/2026-11-26-triton-kernels-h200.md), 1.7 times the throughput of
#: :class:`LinearBlocks`' defaults.
FORWARD_BLOCKS = LinearBlocks(n=64, v=256, k=64, num_warps=8)
#: The backward's tiles (``∂L/∂z`` tiles and their fp32 accumulators): the defaults.
GRAD_BLOCKS = LinearBlocks(v=budgets.GRAD_BLOCKS_V)


@triton.jit
def _logit_tile(
    x_ptr,
    w_ptr,
    rows,
    cols,
    row_ok,
    col_ok,
    hidden,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``X[rows] W[cols]ᵀ`` ``[BLOCK_N, BLOCK_V]`` fp32 (``X``, ``W`` row-major, ``h`` wide)."""
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((rows.shape[0], cols.shape[0]), tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + ks
        k_ok = k < hidden
        x = tl.load(
            x_ptr + rows[:, None] * hidden + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + cols[None, :] * hidden + k[:, None],
            mask=col_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        acc = dot_acc(x, w, acc, PRECISION, UPCAST)
    return acc


@triton.jit
def _forward_kernel(
    x_ptr,
    w_ptr,
    target_ptr,
    max_ptr,
    sums_ptr,
    target_logit_ptr,
    bad_ptr,
    tokens,
    valid,
    hidden,
    inv_t,
    SQUARES: tl.constexpr,
    CUBES: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < tokens
    target = tl.load(target_ptr + rows, mask=row_ok, other=-1)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s0 = tl.zeros((BLOCK_N,), tl.float32)
    s1 = tl.zeros((BLOCK_N,), tl.float32)
    s2 = tl.zeros((BLOCK_N,), tl.float32)
    s3 = tl.zeros((BLOCK_N,), tl.float32)
    s4 = tl.zeros((BLOCK_N,), tl.float32)
    s5 = tl.zeros((BLOCK_N,), tl.float32)
    z_y = tl.zeros((BLOCK_N,), tl.float32)
    bad = tl.zeros((BLOCK_N,), tl.int32)
    for v0 in range(0, valid, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < valid
        z = _logit_tile(
            x_ptr, w_ptr, rows, cols, row_ok, col_ok, hidden, PRECISION, UPCAST, BLOCK_K
        )
        z = tl.where(row_ok[:, None] & col_ok[None, :], z, float("-inf"))
        m, s0, s1, s2, s3, s4, s5 = merge_tile(z, m, s0, s1, s2, s3, s4, s5, inv_t, SQUARES, CUBES)
        bad += count_bad(z)
        z_y += tl.sum(tl.where(cols[None, :] == target[:, None], z, 0.0), axis=1)
    tl.store(max_ptr + rows, m, mask=row_ok)
    store_sums(sums_ptr, rows, row_ok, s0, s1, s2, s3, s4, s5)
    tl.store(target_logit_ptr + rows, z_y, mask=row_ok)
    tl.store(bad_ptr + rows, bad, mask=row_ok)


@triton.jit
def _grad_logit_tile(
    x_ptr,
    w_ptr,
    target_ptr,
    row_stats_ptr,
    rows,
    cols,
    row_ok,
    col_ok,
    hidden,
    inv_t,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``∂L/∂z`` of the tile, fp32 ``[BLOCK_N, BLOCK_V]``, 0 outside real rows and columns."""
    target = tl.load(target_ptr + rows, mask=row_ok, other=-1)
    m, log_s0, entropy, g_l, g_h = load_row_stats(row_stats_ptr, rows, row_ok)
    real = row_ok[:, None] & col_ok[None, :]
    z = _logit_tile(x_ptr, w_ptr, rows, cols, row_ok, col_ok, hidden, PRECISION, UPCAST, BLOCK_K)
    z = tl.where(real, z, float("-inf"))
    grad = grad_tile(z, cols, target, m, log_s0, entropy, g_l, g_h, inv_t)
    return tl.where(real, grad, 0.0)


@triton.jit
def _grad_logits_kernel(
    x_ptr,
    w_ptr,
    target_ptr,
    row_stats_ptr,
    dz_ptr,
    tokens,
    col_start,
    col_stop,
    hidden,
    inv_t,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``∂L/∂z`` of the columns ``[col_start, col_stop)`` into ``dz`` ``[tokens, chunk]`` in the
    inputs' dtype (its column ``j`` is shard column ``col_start + j``; row stride ``chunk``); one
    tile per program, programs over (row blocks, column blocks)."""
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    cols = (col_start + tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    row_ok = rows < tokens
    col_ok = cols < col_stop
    dz = _grad_logit_tile(
        x_ptr,
        w_ptr,
        target_ptr,
        row_stats_ptr,
        rows,
        cols,
        row_ok,
        col_ok,
        hidden,
        inv_t,
        PRECISION,
        UPCAST,
        BLOCK_K,
    )
    chunk = col_stop - col_start
    out = dz_ptr + rows[:, None] * chunk + (cols - col_start)[None, :]
    tl.store(out, dz.to(dz_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check(hidden: Tensor, weight: Tensor) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Row-major ``hidden`` ``[tokens, h]`` and ``weight`` ``[width, h]`` of one dtype, and the
    matmul constants: IEEE fp32 products for fp32 (not TF32; ``tf32`` is Triton's default and
    has no effect on bf16/fp16), fp32 products for bf16 under the interpreter."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden [tokens, h] and weight [width, h], got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden is {hidden.dtype} but weight is {weight.dtype}")
    fp32 = hidden.dtype == torch.float32
    const = {
        "PRECISION": "ieee" if fp32 else "tf32",
        "UPCAST": hidden.dtype == torch.bfloat16 and triton_interpreted(),
    }
    return hidden.contiguous(), weight.contiguous(), const


def linear_partials(
    hidden: Tensor,
    weight: Tensor,
    local_target: Tensor,
    valid: int,
    inv_t: float,
    powers: tuple[int, ...],
    blocks: LinearBlocks | None = None,
) -> ShardPartials:
    """:class:`ShardPartials` of the logits ``hidden @ weight[:valid]ᵀ`` without forming them.

    ``local_target`` ``[tokens]`` int64: the target's row of ``weight``, −1 where another shard
    owns it. ``inv_t`` = 1/T. ``powers``: the pairs beyond ``k = 1`` to compute, as for
    ``logits_stats.shard_partials``. ``blocks``: default :data:`FORWARD_BLOCKS`.
    """
    blocks = blocks or FORWARD_BLOCKS
    hidden, weight, matmul = _check(hidden, weight)
    tokens, h = hidden.shape
    kw: dict[str, Any] = {"device": hidden.device, "dtype": torch.float32}
    local_max, target_logit = torch.empty(tokens, **kw), torch.empty(tokens, **kw)
    sums = torch.zeros(tokens, SUM_COLUMNS, **kw)
    bad = torch.zeros(tokens, dtype=torch.int32, device=hidden.device)
    if tokens > 0:
        launch(_forward_kernel, (triton.cdiv(tokens, blocks.n),))(
            hidden,
            weight,
            local_target.contiguous(),
            local_max,
            sums,
            target_logit,
            bad,
            tokens,
            valid,
            h,
            float(inv_t),
            SQUARES=2 in powers,
            CUBES=3 in powers,
            **matmul,
            BLOCK_N=blocks.n,
            BLOCK_V=blocks.v,
            BLOCK_K=blocks.k,
            num_warps=blocks.num_warps,
        )
    return ShardPartials(local_max, sums, target_logit, bad > 0)


def _mm_fp32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` as fp32 with fp32 accumulation of the products of the operands' values: cuBLAS
    with an fp32 result for bf16/fp16 CUDA operands, else an fp32 product of the upcast operands
    (exact products: the same arithmetic up to summation order)."""
    if a.is_cuda and a.dtype != torch.float32 and _cuda_mm_has_out_dtype():
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


@functools.cache
def _cuda_mm_has_out_dtype() -> bool:
    """Whether this torch's CUDA ``mm`` takes ``out_dtype`` (checked once on tiny operands)."""
    probe = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
    try:
        return torch.mm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


def linear_grads(
    hidden: Tensor,
    weight: Tensor,
    local_target: Tensor,
    valid: int,
    inv_t: float,
    row_stats: Tensor,
    need_hidden: bool,
    need_weight: bool,
    blocks: LinearBlocks | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """``(∂L/∂hidden [tokens, h], ∂L/∂weight [width, h])`` in the inputs' dtype (``None`` where
    not needed); ``row_stats`` ``[tokens, 5]`` fp32 ``[m, log S0, H, g_l, g_H]`` as for
    ``logits_stats.shard_logits_grad``. ``∂L/∂hidden`` is this shard's share (summed over the
    tensor-parallel group by the caller's layer); padded weight rows get 0.

    Per chunk of real columns (``budgets.grad_chunk_columns``: within ``GRAD_CHUNK_BYTES``), the
    kernel writes ``∂L/∂z`` ``[tokens, chunk]`` in the inputs' dtype, then
    ``∂L/∂X += (∂L/∂z) W_chunk`` into an fp32 ``[tokens, h]`` accumulator and
    ``∂L/∂W_chunk = (∂L/∂z)ᵀ X``, both products with fp32 accumulation. ``blocks``: the kernel's
    tiles, default :data:`GRAD_BLOCKS`."""
    blocks = blocks or GRAD_BLOCKS
    hidden, weight, matmul = _check(hidden, weight)
    tokens, h = hidden.shape
    dx = torch.zeros(tokens, h, dtype=torch.float32, device=hidden.device) if need_hidden else None
    dw = torch.zeros_like(weight) if need_weight else None
    itemsize = hidden.element_size()
    chunk = budgets.grad_chunk_columns(tokens, valid, itemsize, blocks.v)
    target, stats = local_target.contiguous(), row_stats.contiguous()
    for start in range(0, valid if tokens > 0 else 0, chunk):
        stop = min(valid, start + chunk)
        dz = torch.empty(tokens, stop - start, dtype=hidden.dtype, device=hidden.device)
        grid = (triton.cdiv(tokens, blocks.n), triton.cdiv(stop - start, blocks.v))
        launch(_grad_logits_kernel, grid)(
            hidden,
            weight,
            target,
            stats,
            dz,
            tokens,
            start,
            stop,
            h,
            float(inv_t),
            **matmul,
            BLOCK_N=blocks.n,
            BLOCK_V=blocks.v,
            BLOCK_K=blocks.k,
            num_warps=blocks.num_warps,
        )
        if dx is not None:
            dx += _mm_fp32(dz, weight[start:stop])
        if dw is not None:
            dw[start:stop] = _mm_fp32(dz.T, hidden)
    return (None if dx is None else dx.to(hidden.dtype)), dw
