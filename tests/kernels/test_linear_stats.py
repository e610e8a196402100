"""``linear_token_stats`` (logits never formed) on one process against float64 and against
autograd of the unfused path (``hidden @ weightᵀ`` then ``token_stats``).

Error model (tolerances.py) plus the logits' own: each fp32 logit ``z = Σ_k x_k w_k`` of ``h``
exact products (bf16/fp16 products are exact in fp32) carries at most ``(h + 1)·u·Σ|x_k w_k|``;
a shift ``δ`` of the logits moves ``log p`` by ≤ ``2δ/T``, so the statistics' budget grows by
``4·δ_max/T`` per row and the gradient terms' relative error by the same.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from opefo_nemo.kernels import budgets
from opefo_nemo.kernels.linear_stats import LinearBlocks, linear_partials
from opefo_nemo.parallel import VOCAB_SUMS, NonFiniteLogitsError, token_stats
from opefo_nemo.parallel.linear_stats import linear_token_stats
from tests.kernels.reference import assert_only_requested_powers, reference_stats
from tests.kernels.tolerances import fused_grad_bounds, fused_row_eps, row_eps, stats_tol

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy on ±inf

FIELDS = ("logprob", "entropy", *VOCAB_SUMS)
VOCAB, WIDTH, HIDDEN, TOKENS = 37, 40, 24, 21  # odd V, 3 padded weight rows, h not a tile multiple
BLOCKS = LinearBlocks(n=16, v=16, k=16, num_warps=1)  # several tiles in every direction


def _inputs(dtype: torch.dtype, seed: int = 0):
    """Hidden ``[TOKENS, HIDDEN]``, weight ``[WIDTH, HIDDEN]`` (padded rows huge: they must not
    count) and targets; logits of scale ~4."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen)
    weight = torch.randn(WIDTH, HIDDEN, generator=gen) * (4 / HIDDEN**0.5)
    weight[VOCAB:] = 1e3
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    return hidden.to(dtype), weight.to(dtype), targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stats_match_float64(dtype, temperature):
    hidden, weight, targets = _inputs(dtype)
    stats = linear_token_stats(
        hidden,
        weight,
        targets,
        temperature=temperature,
        vocab_size=VOCAB,
        sums=VOCAB_SUMS,
        blocks=BLOCKS,
    )
    x64, w64 = hidden.double(), weight[:VOCAB].double()
    z64 = x64 @ w64.T
    ref = reference_stats(z64, targets, temperature)
    eps = fused_row_eps(x64, w64, temperature)
    for name in FIELDS:
        err = (getattr(stats, name).double() - ref[name]).abs()
        assert bool((err <= stats_tol(eps, ref[name])).all()), f"{name}: {err.max():.3g}"


@pytest.mark.parametrize("powers", [(), (3,)])
def test_only_the_requested_powers_are_computed(powers):
    """As for the logits kernel: the pairs of the powers not asked for stay 0, the others are
    the bits of the request for both powers."""
    hidden, weight, targets = _inputs(torch.float32)
    both = linear_partials(hidden, weight, targets, VOCAB, 0.7, (2, 3), BLOCKS)
    some = linear_partials(hidden, weight, targets, VOCAB, 0.7, powers, BLOCKS)
    assert_only_requested_powers(some.sums, both.sums, powers)


@pytest.mark.parametrize("chunked", [False, True], ids=["one-chunk", "16-column-chunks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_float64_and_unfused_autograd(dtype, chunked, monkeypatch):
    """``∂/∂hidden = (∂L/∂z) W`` and ``∂/∂weight = (∂L/∂z)ᵀ X``: the terms of ``∂L/∂z`` carry
    relative error ``ε`` (row budget + logit error + the rounding of ``∂L/∂z`` to the input dtype
    before the matmul), the matmul adds ``(V + N)·u`` of its magnitudes (over the chunks too), the
    result one rounding to the output dtype. The unfused path in fp32 meets the same bound, so the
    two are compared at twice it. The backward runs in one chunk of columns, or in chunks of 16
    (a budget that holds ``[tokens, 16]``: three chunks of the 37 real columns)."""
    if chunked:
        monkeypatch.setattr(budgets, "GRAD_CHUNK_BYTES", TOKENS * 16 * dtype.itemsize)
    hidden, weight, targets = _inputs(dtype)
    temperature = 0.7
    gen = torch.Generator().manual_seed(5)
    g_l, g_h = torch.randn(TOKENS, generator=gen), torch.randn(TOKENS, generator=gen)

    def grads(fused: bool):
        x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        kw = {"temperature": temperature, "vocab_size": VOCAB}
        if fused:
            stats = linear_token_stats(x, w, targets, blocks=BLOCKS, **kw)
        else:
            stats = token_stats(x.float() @ w.float().T, targets, kernel="torch", **kw)
        ((stats.logprob * g_l).sum() + (stats.entropy * g_h).sum()).backward()
        return x.grad, w.grad

    dx, dw = grads(fused=True)
    assert dx.dtype == dtype and dw.dtype == dtype
    assert bool((dw[VOCAB:] == 0).all())
    x64 = hidden.double().requires_grad_()
    w64 = weight[:VOCAB].double().requires_grad_()
    ref = reference_stats(x64 @ w64.T, targets, temperature)
    ((ref["logprob"] * g_l.double()).sum() + (ref["entropy"] * g_h.double()).sum()).backward()
    bound_x, bound_w = fused_grad_bounds(
        x64.detach(), w64.detach(), targets, temperature, g_l, g_h, dtype, (x64.grad, w64.grad)
    )
    assert bool(((dx.double() - x64.grad).abs() <= bound_x).all())
    assert bool(((dw[:VOCAB].double() - w64.grad).abs() <= bound_w).all())
    ux, uw = grads(fused=False)
    assert bool(((dx.double() - ux.double()).abs() <= 2 * bound_x).all())
    assert bool(((dw[:VOCAB].double() - uw[:VOCAB].double()).abs() <= 2 * bound_w).all())


def test_no_tensor_of_the_logits_size(monkeypatch):
    """Forward and backward make no torch tensor as large as the bf16 logits ``[tokens, V]``
    when the backward's chunk budget holds fewer columns than ``V`` (here 32 of 160): none
    exceeds the fp32 ``[tokens, h]`` accumulator, an fp32 ``[V, h]`` and the chunk's
    ``[tokens, 32]`` gradient upcast to fp32 for the CPU's product (what the memory estimate of
    launch/memory.py counts). Every op's output is recorded, Triton's interpreter's copies of the
    kernel arguments included."""
    tokens, vocab, hidden_size, chunk = 64, 160, 16, 32
    monkeypatch.setattr(budgets, "GRAD_CHUNK_BYTES", tokens * chunk * 2)
    gen = torch.Generator().manual_seed(0)
    made: list[int] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor):
                    made.append(tensor.untyped_storage().nbytes())
            return out

    x = torch.randn(tokens, hidden_size, generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden_size, generator=gen) / 4).bfloat16().requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    with Record():
        stats = linear_token_stats(x, w, targets, temperature=0.7, blocks=BLOCKS)
        (stats.logprob.sum() + stats.entropy.sum()).backward()
    assert max(made) <= max(tokens * hidden_size, vocab * hidden_size, tokens * chunk) * 4
    assert max(made) < tokens * vocab * 2


def test_one_input_with_gradient_and_no_graph():
    hidden, weight, targets = _inputs(torch.float32)
    x = hidden.clone().requires_grad_()
    stats = linear_token_stats(x, weight, targets, vocab_size=VOCAB, blocks=BLOCKS)
    stats.entropy.sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0) and weight.grad is None
    with torch.no_grad():
        plain = linear_token_stats(x, weight, targets, vocab_size=VOCAB, blocks=BLOCKS)
    assert plain.logprob.grad_fn is None
    assert torch.equal(plain.entropy, stats.entropy.detach())


def test_three_dim_layout_and_default_blocks():
    """``[seq, batch, h]`` hidden states give the per-token results of the flat call, with the
    default (GPU-sized) tiles as well."""
    hidden, weight, targets = _inputs(torch.float32)
    hidden, targets = hidden[:20], targets[:20]
    flat = linear_token_stats(hidden, weight, targets, vocab_size=VOCAB, blocks=BLOCKS)
    cube = linear_token_stats(
        hidden.view(5, 4, HIDDEN), weight, targets.view(5, 4), vocab_size=VOCAB
    )
    assert cube.logprob.shape == (5, 4)
    eps = row_eps(hidden.double() @ weight[:VOCAB].double().T, 1.0)
    for name in ("logprob", "entropy"):
        a, b = getattr(cube, name).reshape(-1).double(), getattr(flat, name).double()
        assert bool(((a - b).abs() <= 2 * stats_tol(eps, b)).all()), name


def test_errors():
    hidden, weight, targets = _inputs(torch.float32)
    with pytest.raises(TypeError, match=r"hidden is torch\.float32 but weight is torch\.bfloat16"):
        linear_token_stats(hidden, weight.bfloat16(), targets, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="expected weight"):
        linear_token_stats(hidden, weight[:, :5], targets, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        linear_token_stats(hidden, weight, targets + VOCAB, vocab_size=VOCAB)
    hidden[3, 2] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="1 tokens have non-finite statistics"):
        linear_token_stats(hidden, weight, targets, vocab_size=VOCAB, blocks=BLOCKS)
