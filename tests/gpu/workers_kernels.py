"""Rank function of ``test_kernels_compiled.py``: the Triton kernels on one device, compiled on a
GPU, against float64 with the error model of ``tests/kernels/tolerances.py``.

Run in a process of its own: whether Triton compiles or interprets is fixed when a kernel module
is imported (``TRITON_INTERPRET``), and ``tests/conftest.py`` sets the interpreter for the CPU
tests. Shapes are larger than the interpreter tests' (several vocabulary and hidden tiles per
row, odd sizes, padded columns) but seconds on a GPU.
"""

from __future__ import annotations

import torch

from opefo_nemo.parallel import VOCAB_SUMS, token_stats
from opefo_nemo.parallel.linear_stats import linear_token_stats
from tests.kernels.reference import reference_grads, reference_stats
from tests.kernels.tolerances import (
    fused_grad_bounds,
    fused_row_eps,
    logits_grad_bound,
    row_eps,
    stats_tol,
)

TOKENS, VOCAB, WIDTH, HIDDEN = 300, 4099, 4224, 200  # 125 padded columns, h not a tile multiple
TEMPERATURE = 0.7
FIELDS = ("logprob", "entropy", *VOCAB_SUMS)
DTYPES = (torch.float32, torch.bfloat16)


def _check_stats(stats, z64: torch.Tensor, targets: torch.Tensor, eps: torch.Tensor, what: str):
    ref = reference_stats(z64, targets, TEMPERATURE)
    for name in FIELDS:
        err = (getattr(stats, name).double() - ref[name]).abs()
        tol = stats_tol(eps, ref[name])
        assert bool((err <= tol).all()), f"{what} {name}: error {err.max():.3g}"


def logits_kernel(device: str, dtype: torch.dtype) -> None:
    """``token_stats(kernel="triton")``: statistics and the logits' gradient."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, WIDTH, generator=gen) * 4
    logits[:, VOCAB:] = 1e4  # padded columns must not count
    logits[1, ::7] = float("-inf")
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    g_l, g_h = (torch.randn(TOKENS, generator=gen).to(device) for _ in range(2))
    leaf = logits.to(device, dtype).requires_grad_()
    on_device = targets.to(device)
    stats = token_stats(
        leaf,
        on_device,
        temperature=TEMPERATURE,
        vocab_size=VOCAB,
        sums=VOCAB_SUMS,
        kernel="triton",
    )
    z64 = leaf.detach()[:, :VOCAB].double()
    _check_stats(stats, z64, on_device, row_eps(z64, TEMPERATURE), f"logits {dtype}")
    ((stats.logprob * g_l).sum() + (stats.entropy * g_h).sum()).backward()
    ref = reference_grads(z64, on_device, TEMPERATURE, g_l, g_h)
    bound = logits_grad_bound(z64, on_device, TEMPERATURE, g_l, g_h, dtype, ref)
    assert bool((leaf.grad[:, VOCAB:] == 0).all()), "logits: padded gradient"
    err = (leaf.grad[:, :VOCAB].double() - ref).abs()
    assert bool((err <= bound).all()), f"logits {dtype} gradient: error {err.max():.3g}"


def linear_kernel(device: str, dtype: torch.dtype) -> None:
    """``linear_token_stats``: statistics and the gradients to the hidden states and the weight,
    bounded as in tests/kernels/test_linear_stats.py."""
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen)
    weight = torch.randn(WIDTH, HIDDEN, generator=gen) * (4 / HIDDEN**0.5)
    weight[VOCAB:] = 1e3
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen).to(device)
    g_l, g_h = (torch.randn(TOKENS, generator=gen).to(device) for _ in range(2))
    x = hidden.to(device, dtype).requires_grad_()
    w = weight.to(device, dtype).requires_grad_()
    stats = linear_token_stats(
        x, w, targets, temperature=TEMPERATURE, vocab_size=VOCAB, sums=VOCAB_SUMS
    )
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach()[:VOCAB].double().requires_grad_()
    z64 = x64 @ w64.T
    eps = fused_row_eps(x64.detach(), w64.detach(), TEMPERATURE)
    _check_stats(stats, z64.detach(), targets, eps, f"linear {dtype}")
    ((stats.logprob * g_l).sum() + (stats.entropy * g_h).sum()).backward()
    ref = reference_stats(z64, targets, TEMPERATURE)
    ((ref["logprob"] * g_l.double()).sum() + (ref["entropy"] * g_h.double()).sum()).backward()
    bound_x, bound_w = fused_grad_bounds(
        x64.detach(), w64.detach(), targets, TEMPERATURE, g_l, g_h, dtype, (x64.grad, w64.grad)
    )
    assert bool((w.grad[VOCAB:] == 0).all()), "linear: padded weight rows' gradient"
    err_x = (x.grad.double() - x64.grad).abs()
    err_w = (w.grad[:VOCAB].double() - w64.grad).abs()
    assert bool((err_x <= bound_x).all()), f"linear {dtype} hidden gradient: {err_x.max():.3g}"
    assert bool((err_w <= bound_w).all()), f"linear {dtype} weight gradient: {err_w.max():.3g}"


def compiled_kernels(rank: int, world_size: int, device: str) -> None:
    """Both kernels in both dtypes on ``device`` (``cuda``: compiled; ``cpu``: only under the
    interpreter, how this file's logic is checked without a GPU)."""
    for dtype in DTYPES:
        logits_kernel(device, dtype)
        linear_kernel(device, dtype)
