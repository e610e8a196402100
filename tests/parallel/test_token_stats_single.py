"""token_stats on one process (TP = 1, no group) against float64 full-vocabulary references."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.parallel import VOCAB_SUMS, NonFiniteLogitsError, token_stats
from tests.parallel.reference import (
    assert_grad_within_bound,
    assert_stats_within_bounds,
    reference_stats,
)

FIELDS = ("logprob", "entropy", *VOCAB_SUMS)


def _batch(tokens: int = 23, vocab: int = 37, scale: float = 4.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=gen) * scale
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    return logits, targets


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [None, 1, 7])
def test_fp32_matches_reference(temperature: float, chunk_size: int | None) -> None:
    logits, targets = _batch()
    stats = token_stats(
        logits, targets, temperature=temperature, sums=VOCAB_SUMS, chunk_size=chunk_size
    )
    ref = reference_stats(logits, targets, temperature)
    assert all(getattr(stats, name).dtype == torch.float32 for name in FIELDS)
    assert_stats_within_bounds(stats, ref, logits, temperature)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input(dtype: torch.dtype) -> None:
    """Arithmetic is fp32: against the rounded logits the error is fp32 round-off; against the
    unrounded fp32 logits it is the input rounding alone (documented in docs/parallel.md)."""
    logits, targets = _batch()
    low = logits.to(dtype)
    stats = token_stats(low, targets, sums=VOCAB_SUMS, chunk_size=5)
    ref_rounded = reference_stats(low.double(), targets)
    ref_exact = reference_stats(logits, targets)
    assert_stats_within_bounds(stats, ref_rounded, low.double(), 1.0, str(dtype))
    input_tol = 0.1 if dtype == torch.bfloat16 else 0.02
    for name in ("logprob", "entropy"):
        assert (getattr(stats, name).double() - ref_exact[name]).abs().max() < input_tol


def test_batch_seq_layout_and_default_vocab() -> None:
    logits, targets = _batch(tokens=24)
    stats3 = token_stats(logits.view(4, 6, -1), targets.view(4, 6), chunk_size=5)
    stats2 = token_stats(logits, targets, chunk_size=5)
    assert stats3.logprob.shape == (4, 6) and stats3.sum_p2 is None and stats3.sum_p2_logp is None
    torch.testing.assert_close(stats3.logprob.reshape(-1), stats2.logprob, atol=0, rtol=0)
    torch.testing.assert_close(stats3.entropy.reshape(-1), stats2.entropy, atol=0, rtol=0)


def test_padded_columns_are_excluded() -> None:
    logits, targets = _batch(vocab=37)
    padding = torch.full((logits.shape[0], 3), 50.0)  # would dominate the softmax if counted
    padded = torch.cat([logits, padding], dim=1)
    stats = token_stats(padded, targets, vocab_size=37, sums=VOCAB_SUMS)
    plain = token_stats(logits, targets, sums=VOCAB_SUMS)
    for name in FIELDS:
        torch.testing.assert_close(getattr(stats, name), getattr(plain, name), atol=0, rtol=0)


def test_masked_minus_inf_logits_are_allowed() -> None:
    logits, targets = _batch()
    logits[:, :5] = float("-inf")
    targets = targets.clamp(min=5)
    leaf = logits.clone().requires_grad_()
    stats = token_stats(leaf, targets, sums=VOCAB_SUMS, chunk_size=6)
    ref = reference_stats(logits[:, 5:], targets - 5)
    assert_stats_within_bounds(stats, ref, logits[:, 5:], 1.0)
    (stats.logprob.sum() + stats.entropy.sum()).backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[:, :5] == 0).all()


@pytest.mark.parametrize("which", ["logprob", "entropy", "both"])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradients_match_autograd_on_full_logits(which: str, temperature: float) -> None:
    logits, targets = _batch()
    gen = torch.Generator().manual_seed(1)
    g_l = torch.randn(logits.shape[0], generator=gen) * (which != "entropy")
    g_h = torch.randn(logits.shape[0], generator=gen) * (which != "logprob")
    leaf = logits.clone().requires_grad_()
    stats = token_stats(leaf, targets, temperature=temperature, chunk_size=4, sums=VOCAB_SUMS)
    loss = torch.zeros(())
    if which != "entropy":
        loss = loss + (stats.logprob * g_l).sum()
    if which != "logprob":
        loss = loss + (stats.entropy * g_h).sum()
    (grad,) = torch.autograd.grad(loss, leaf)
    assert_grad_within_bound(grad, logits, targets, temperature, g_l, g_h)


def test_bf16_gradient_is_in_input_dtype() -> None:
    logits, targets = _batch()
    leaf = logits.to(torch.bfloat16).requires_grad_()
    stats = token_stats(leaf, targets, chunk_size=8)
    stats.logprob.sum().backward()
    assert leaf.grad.dtype == torch.bfloat16
    ones, zeros = torch.ones(23), torch.zeros(23)
    assert_grad_within_bound(leaf.grad, leaf.detach().double(), targets, 1.0, ones, zeros)


def test_backward_saves_no_softmax() -> None:
    """Autograd keeps the input logits and per-token vectors only, never a [tokens, V] fp32 copy."""
    logits, targets = _batch()
    leaf = logits.clone().requires_grad_()
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stats = token_stats(leaf, targets, sums=VOCAB_SUMS, chunk_size=4)
    big = [t for t in saved if t.numel() >= leaf.numel()]
    assert len(big) == 1 and big[0].data_ptr() == leaf.data_ptr()
    assert all(t.dim() <= 1 for t in saved if t is not big[0])
    stats.entropy.sum().backward()
    assert leaf.grad is not None


def test_forward_only_builds_no_graph() -> None:
    logits, targets = _batch()
    leaf = logits.clone().requires_grad_()
    with torch.no_grad():
        stats = token_stats(leaf, targets, sums=VOCAB_SUMS)
    assert stats.logprob.grad_fn is None and not stats.entropy.requires_grad
    plain = token_stats(logits, targets)
    assert plain.logprob.grad_fn is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_name_rank_and_count(bad: float) -> None:
    logits, targets = _batch()
    logits[3, 7] = bad
    logits[11, 0] = bad
    logits[11, 5] = bad
    with pytest.raises(NonFiniteLogitsError, match=r"TP rank 0 .*: 2 tokens .* 2 of them"):
        token_stats(logits, targets, chunk_size=4)


def test_bad_inputs_are_named() -> None:
    logits, targets = _batch(vocab=37)
    with pytest.raises(ValueError, match="target id 37 at flat position 2"):
        token_stats(logits, torch.tensor([0, 1, 37] + [0] * 20))
    with pytest.raises(ValueError, match="target id -1"):
        token_stats(logits, torch.full((23,), -1))
    with pytest.raises(ValueError, match="target id 36"):
        token_stats(logits, torch.full((23,), 36), vocab_size=30)
    with pytest.raises(ValueError, match="vocab_size=40 does not fit"):
        token_stats(logits, targets, vocab_size=40)
    with pytest.raises(ValueError, match="temperature"):
        token_stats(logits, targets, temperature=0.0)
    with pytest.raises(ValueError, match=r"targets of the leading shape"):
        token_stats(logits, targets[:-1])
    with pytest.raises(TypeError, match="int64"):
        token_stats(logits, targets.float())
    with pytest.raises(ValueError, match="unknown vocabulary sum 'sum_p4'"):
        token_stats(logits, targets, sums=("sum_p2", "sum_p4"))
    with pytest.raises(TypeError, match="sequence of names, got the string 'sum_p2'"):
        token_stats(logits, targets, sums="sum_p2")
