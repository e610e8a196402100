"""``token_stats(kernel="triton")`` on one process (TP 1) against float64 and the torch kernel.

Shapes are small (Triton's interpreter runs every program in Python); the vocabulary tile is
narrowed to 16 columns in some cases so that rows span several tiles and the online rescaling of
the sums is exercised.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from opefo_nemo.kernels import logits_stats
from opefo_nemo.parallel import VOCAB_SUMS, NonFiniteLogitsError, token_stats
from tests.kernels.reference import (
    assert_only_requested_powers,
    reference_grads,
    reference_stats,
)
from tests.kernels.tolerances import logits_grad_bound, row_eps, stats_tol

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy on ±inf

FIELDS = ("logprob", "entropy", *VOCAB_SUMS)
VOCAB, WIDTH, TOKENS = 37, 40, 11  # odd vocabulary, 3 padded columns


@pytest.fixture(params=[16, 4096], ids=["tiles16", "one_tile"])
def tile(request, monkeypatch):
    monkeypatch.setattr(logits_stats, "MAX_BLOCK_V", request.param)
    return request.param


def _batch(scale: float = 4.0, seed: int = 0):
    """Logits ``[TOKENS, WIDTH]`` whose padded columns hold 1e4 (they must not count)."""
    gen = torch.Generator().manual_seed(seed)
    real = torch.randn(TOKENS, VOCAB, generator=gen) * scale
    logits = torch.cat([real, torch.full((TOKENS, WIDTH - VOCAB), 1e4)], dim=1)
    return logits, torch.randint(0, VOCAB, (TOKENS,), generator=gen)


def _assert_stats(stats, z64: torch.Tensor, targets: torch.Tensor, temperature: float) -> None:
    ref = reference_stats(z64, targets, temperature)
    eps = row_eps(z64, temperature)
    for name in FIELDS:
        got = getattr(stats, name).double()
        assert got.dtype == torch.float64 and got.shape == ref[name].shape
        err, tol = (got - ref[name]).abs(), stats_tol(eps, ref[name])
        assert bool((err <= tol).all()), f"{name}: error {err.max():.3g} > bound {tol.min():.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stats_match_float64_and_torch(tile, dtype, temperature):
    logits, targets = _batch()
    low = logits.to(dtype)
    kw = {"temperature": temperature, "vocab_size": VOCAB, "sums": VOCAB_SUMS}
    stats = token_stats(low, targets, kernel="triton", **kw)
    _assert_stats(stats, low[:, :VOCAB].double(), targets, temperature)
    torch_stats = token_stats(low, targets, kernel="torch", **kw)
    eps = row_eps(low[:, :VOCAB].double(), temperature)
    for name in FIELDS:  # both within the bound of float64, so within twice it of each other
        ours, theirs = getattr(stats, name).double(), getattr(torch_stats, name).double()
        assert bool(((ours - theirs).abs() <= 2 * stats_tol(eps, theirs)).all()), name


def test_extreme_and_masked_logits(tile):
    """±1e4 logits, ``−inf`` (masked) entries and a row whose only finite logit is the target."""
    logits, targets = _batch()
    logits[0, :5], logits[1, 3:9] = 1e4, -1e4
    logits[2, ::3] = float("-inf")
    logits[3, :VOCAB] = float("-inf")
    logits[3, targets[3]] = -1e4
    targets[2] = 1
    for temperature in (1.0, 0.7):
        stats = token_stats(
            logits,
            targets,
            temperature=temperature,
            vocab_size=VOCAB,
            sums=VOCAB_SUMS,
            kernel="triton",
        )
        _assert_stats(stats, logits[:, :VOCAB].double(), targets, temperature)
    assert stats.logprob[3] == 0 and stats.entropy[3] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["logprob", "entropy", "both"])
def test_gradients_match_float64(tile, dtype, which):
    """The gradient written by the kernel, in the logits' dtype: fp32 arithmetic (bound ε·M with
    ``M`` the term magnitudes, tolerances.py) plus one rounding to the output dtype; padded
    columns exactly 0."""
    logits, targets = _batch()
    logits[4, ::4] = float("-inf")
    temperature = 0.7
    leaf = logits.to(dtype).requires_grad_()
    gen = torch.Generator().manual_seed(3)
    g_l = torch.randn(TOKENS, generator=gen) if which != "entropy" else torch.zeros(TOKENS)
    g_h = torch.randn(TOKENS, generator=gen) if which != "logprob" else torch.zeros(TOKENS)
    stats = token_stats(leaf, targets, temperature=temperature, vocab_size=VOCAB, kernel="triton")
    loss = 0
    if which != "entropy":
        loss = loss + (stats.logprob * g_l).sum()
    if which != "logprob":
        loss = loss + (stats.entropy * g_h).sum()
    loss.backward()
    assert leaf.grad.dtype == dtype
    assert bool((leaf.grad[:, VOCAB:] == 0).all())
    z64 = leaf.detach()[:, :VOCAB].double()
    ref = reference_grads(z64, targets, temperature, g_l, g_h)
    bound = logits_grad_bound(z64, targets, temperature, g_l, g_h, dtype, ref)
    err = (leaf.grad[:, :VOCAB].double() - ref).abs()
    assert bool((err <= bound).all()), f"error {err.max():.3g}"


def test_chunks_and_layout_do_not_change_results():
    """Rows are independent: any chunking and a ``[batch, seq]`` layout give the same bits."""
    logits, targets = _batch()
    logits = logits[:10]
    whole = token_stats(logits, targets[:10], vocab_size=VOCAB, sums=VOCAB_SUMS, kernel="triton")
    parts = token_stats(
        logits.view(2, 5, WIDTH),
        targets[:10].view(2, 5),
        vocab_size=VOCAB,
        sums=VOCAB_SUMS,
        chunk_size=3,
        kernel="triton",
    )
    for name in FIELDS:
        assert torch.equal(getattr(parts, name).reshape(-1), getattr(whole, name))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_raise(bad):
    logits, targets = _batch()
    logits[5, 7] = bad
    with pytest.raises(NonFiniteLogitsError, match="1 tokens have non-finite statistics"):
        token_stats(logits, targets, vocab_size=VOCAB, kernel="triton")
    logits[5, 7] = 0.0
    logits[6, :] = float("-inf")
    with pytest.raises(NonFiniteLogitsError, match="0 of them have NaN"):
        token_stats(logits, targets, vocab_size=VOCAB, kernel="triton")


@pytest.mark.parametrize("powers", [(), (2,), (3,)])
def test_only_the_requested_powers_are_computed(powers):
    """The kernel fills the pairs ``Σ e^k``, ``Σ e^k·d`` of the powers asked for and leaves the
    others 0; each pair is the same bits whether or not the other power is computed."""
    logits, targets = _batch()
    local = torch.where(targets < VOCAB, targets, -1)
    both = logits_stats.shard_partials(logits, local, VOCAB, 0.7, (2, 3))
    some = logits_stats.shard_partials(logits, local, VOCAB, 0.7, powers)
    assert_only_requested_powers(some.sums, both.sums, powers)


@pytest.mark.parametrize(
    "sums", [(), ("sum_p2",), ("sum_p3_logp",), ("sum_p2_logp", "sum_p3")], ids=str
)
def test_token_stats_returns_exactly_the_requested_sums(sums):
    logits, targets = _batch()
    kw = {"temperature": 0.7, "vocab_size": VOCAB, "kernel": "triton"}
    everything = token_stats(logits, targets, sums=VOCAB_SUMS, **kw)
    stats = token_stats(logits, targets, sums=sums, **kw)
    assert set(stats.present()) == {"logprob", "entropy", *sums}
    for name, value in stats.present().items():
        assert torch.equal(value, getattr(everything, name)), name


def test_padding_may_hold_anything():
    """Padded columns are never read: NaN there changes nothing."""
    logits, targets = _batch()
    clean = token_stats(logits, targets, vocab_size=VOCAB, kernel="triton")
    logits[:, VOCAB:] = float("nan")
    dirty = token_stats(logits, targets, vocab_size=VOCAB, kernel="triton")
    assert torch.equal(clean.logprob, dirty.logprob) and torch.equal(clean.entropy, dirty.entropy)


def test_kernel_choice_errors(monkeypatch):
    logits, targets = _batch()
    with pytest.raises(ValueError, match="stats kernel 'cuda' is not one of auto, torch, triton"):
        token_stats(logits, targets, kernel="cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        token_stats(logits, targets, kernel="triton")
