"""Rank functions for the Triton kernels at TP 2 over gloo (run by tests/parallel/world.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from opefo_nemo.kernels.linear_stats import LinearBlocks
from opefo_nemo.parallel import VOCAB_SUMS, NonFiniteLogitsError, token_stats
from opefo_nemo.parallel.linear_stats import linear_token_stats
from tests.kernels.reference import reference_grads, reference_stats
from tests.kernels.tolerances import U32, grad_scale, logits_grad_bound, row_eps, stats_tol
from tests.parallel.collectives import all_reduce_payloads, count_collectives

VOCAB, WIDTH, TOKENS, HIDDEN = 37, 20, 9, 24  # 37 real of 2 × 20 columns
FIELDS = ("logprob", "entropy", *VOCAB_SUMS)
TEMPERATURE = 0.7
ONE_PASS = {"all_reduce:MAX": 1, "all_reduce:SUM": 1}


def _logits() -> tuple[torch.Tensor, torch.Tensor]:
    """The same full ``[TOKENS, 2·WIDTH]`` logits and targets on every rank: extremes, masked
    entries, a row whose rank-1 columns are all ``−inf``; padding holds 1e4."""
    gen = torch.Generator().manual_seed(11)
    full = torch.randn(TOKENS, 2 * WIDTH, generator=gen) * 4
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    full[0, :3], full[0, 30:33] = 1e4, -1e4
    full[1, ::5] = float("-inf")
    full[2, WIDTH:] = float("-inf")
    targets[1], targets[2] = 2, 4
    full[:, VOCAB:] = 1e4
    return full, targets


def _check(stats, z64: torch.Tensor, targets: torch.Tensor, extra_eps=0.0) -> None:
    ref = reference_stats(z64, targets, TEMPERATURE)
    eps = row_eps(z64, TEMPERATURE) + extra_eps
    for name in FIELDS:
        err = (getattr(stats, name).double() - ref[name]).abs()
        assert bool((err <= stats_tol(eps, ref[name])).all()), f"{name}: {err.max():.3g}"


def logits_kernel(rank: int, world_size: int) -> None:
    """TP 2, fp32 and bf16: statistics and the shard's gradient equal float64 on the full
    vocabulary; one all-reduce MAX and one SUM in forward, none in backward; NaN on one rank
    fails both."""
    group = dist.group.WORLD
    full, targets = _logits()
    gen = torch.Generator().manual_seed(2)
    g_l, g_h = torch.randn(TOKENS, generator=gen), torch.randn(TOKENS, generator=gen)
    columns = slice(rank * WIDTH, (rank + 1) * WIDTH)
    for dtype in (torch.float32, torch.bfloat16):
        rounded = full.to(dtype)
        local = rounded[:, columns].clone().requires_grad_()
        kw = {"temperature": TEMPERATURE, "group": group, "vocab_size": VOCAB, "kernel": "triton"}
        with count_collectives() as forward, all_reduce_payloads() as payloads:
            stats = token_stats(local, targets, sums=VOCAB_SUMS, **kw)
        assert dict(forward) == ONE_PASS, dict(forward)
        assert ("SUM", (TOKENS, 7)) in payloads, payloads
        z64 = rounded[:, :VOCAB].double()
        _check(stats, z64, targets)
        with count_collectives() as backward:
            ((stats.logprob * g_l).sum() + (stats.entropy * g_h).sum()).backward()
        assert dict(backward) == {}
        ref = reference_grads(z64, targets, TEMPERATURE, g_l, g_h)
        bound = logits_grad_bound(z64, targets, TEMPERATURE, g_l, g_h, dtype, ref)
        real = min(WIDTH, VOCAB - rank * WIDTH)
        cols = slice(rank * WIDTH, rank * WIDTH + real)
        err = (local.grad[:, :real].double() - ref[:, cols]).abs()
        assert bool((err <= bound[:, cols]).all()), f"{dtype}: gradient error {err.max():.3g}"
        assert bool((local.grad[:, real:] == 0).all())
    with all_reduce_payloads() as payloads:
        token_stats(full[:, columns], targets, group=group, vocab_size=VOCAB, kernel="triton")
    assert ("SUM", (TOKENS, 3)) in payloads, "without a request the packet is as before"
    bad = full[:, columns].clone()
    if rank == 1:
        bad[4, 0] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="1 tokens have non-finite"):
        token_stats(bad, targets, group=group, vocab_size=VOCAB, kernel="triton")


def linear_kernel(rank: int, world_size: int) -> None:
    """TP 2, fused with the output layer: statistics equal float64; the weight shard's gradient
    equals float64's rows and the unfused TP-2 path's; the hidden-state gradients of the two
    ranks sum to float64's (each rank's share equals the unfused path's share)."""
    group = dist.group.WORLD
    gen = torch.Generator().manual_seed(13)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen)
    weight = torch.randn(2 * WIDTH, HIDDEN, generator=gen) * (4 / HIDDEN**0.5)
    weight[VOCAB:] = 1e3
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    g_l, g_h = torch.randn(TOKENS, generator=gen), torch.randn(TOKENS, generator=gen)
    rows = slice(rank * WIDTH, (rank + 1) * WIDTH)
    blocks = LinearBlocks(n=16, v=16, k=16, num_warps=1)

    def run(fused: bool):
        x, w = hidden.clone().requires_grad_(), weight[rows].clone().requires_grad_()
        kw = {"temperature": TEMPERATURE, "group": group, "vocab_size": VOCAB}
        with count_collectives() as forward, all_reduce_payloads() as payloads:
            if fused:
                stats = linear_token_stats(x, w, targets, sums=VOCAB_SUMS, blocks=blocks, **kw)
            else:
                stats = token_stats(x @ w.T, targets, sums=VOCAB_SUMS, kernel="torch", **kw)
        assert dict(forward) == ONE_PASS, dict(forward)
        assert ("SUM", (TOKENS, 7)) in payloads, payloads
        ((stats.logprob * g_l).sum() + (stats.entropy * g_h).sum()).backward()
        return stats, x.grad, w.grad

    stats, dx, dw = run(fused=True)
    x64 = hidden.double().requires_grad_()
    w64 = weight[:VOCAB].double().requires_grad_()
    z64 = x64 @ w64.T
    logit_err = (HIDDEN + 1) * U32 * (hidden.double().abs() @ w64.detach().abs().T).amax(1)
    eps = row_eps(z64.detach(), TEMPERATURE) + 4 * logit_err / TEMPERATURE
    _check(stats, z64.detach(), targets, extra_eps=4 * logit_err / TEMPERATURE)
    ref = reference_stats(z64, targets, TEMPERATURE)
    ((ref["logprob"] * g_l.double()).sum() + (ref["entropy"] * g_h.double()).sum()).backward()
    scale = (eps + 2 * VOCAB * U32)[:, None] * grad_scale(
        z64.detach(), targets, TEMPERATURE, g_l, g_h
    )
    real = min(WIDTH, VOCAB - rank * WIDTH)
    mine = slice(rank * WIDTH, rank * WIDTH + real)
    bound_w = scale[:, mine].T @ hidden.double().abs() + U32 * w64.grad[mine].abs()
    assert bool(((dw[:real].double() - w64.grad[mine]).abs() <= bound_w).all())
    assert bool((dw[real:] == 0).all())
    bound_x = scale @ w64.detach().abs() + U32 * x64.grad.abs()
    total = dx.double().clone()
    dist.all_reduce(total, group=group)
    assert bool(((total - x64.grad).abs() <= bound_x).all())
    _, ux, uw = run(fused=False)
    assert bool(((dx.double() - ux.double()).abs() <= 2 * bound_x).all())
    assert bool(((dw[:real].double() - uw[:real].double()).abs() <= 2 * bound_w).all())
