"""spec §5 ``correct_only`` and ``incorrect_only``: strict GRPO's loss kept on one sign of the
advantage. On a linear softmax policy whose batch is cut into two chunks: the loss against a
float64 loop over tokens, the gradient against autograd of the explicit formula in float64, the
two gradients against strict GRPO's (they add up to it), batches of one sign, the metrics of
the applied weights (spec §6) and the truncated importance-sampling weight."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import TokenChunk, build_objective, method_config, policy_loss
from opefo_nemo.core.objectives import prepare as prepare_step
from tests.core import reference as ref
from tests.metric_bounds import U32

SIGNS = {"correct_only": 1, "incorrect_only": -1}
GROUPS, GROUP, LENGTH, FEATURES, VOCAB = 4, 4, 9, 5, 7
ROWS = GROUPS * GROUP
#: The batch cut into two chunks (micro-batches), at a row inside a group
CUT = 6


@dataclass(frozen=True)
class Batch:
    """A linear softmax policy's batch: ``logits = features @ theta``; ``advantages`` per token
    (each response's, broadcast), fp32."""

    features: torch.Tensor  # [ROWS, LENGTH, FEATURES]
    theta: torch.Tensor  # [FEATURES, VOCAB]
    tokens: torch.Tensor  # [ROWS, LENGTH]
    mask: torch.Tensor  # [ROWS, LENGTH]
    advantages: torch.Tensor  # [ROWS, LENGTH]


def grouped_batch(seed: int, rewards: list[float] | None = None) -> Batch:
    """Binary rewards (every group of mixed outcomes unless ``rewards`` is given), GRPO's group
    advantages from the brute-force reference, random lengths."""
    g = torch.Generator().manual_seed(seed)
    if rewards is None:
        rewards = [float(x) for x in (torch.rand(ROWS, generator=g) < 0.4).tolist()]
        for k in range(GROUPS):  # one right and one wrong response in each group
            rewards[k * GROUP : k * GROUP + 2] = [1.0, 0.0]
    groups = [k // GROUP for k in range(ROWS)]
    adv = torch.tensor(ref.advantages(rewards, groups), dtype=torch.float32)
    return signed_batch(g, adv)


def signed_batch(g: torch.Generator, adv: torch.Tensor) -> Batch:
    lengths = torch.randint(3, LENGTH + 1, (ROWS,), generator=g)
    return Batch(
        features=torch.randn(ROWS, LENGTH, FEATURES, generator=g),
        theta=torch.randn(FEATURES, VOCAB, generator=g) * 0.7,
        tokens=torch.randint(0, VOCAB, (ROWS, LENGTH), generator=g),
        mask=torch.arange(LENGTH)[None, :] < lengths[:, None],
        advantages=adv[:, None].expand(ROWS, LENGTH).contiguous(),
    )


@dataclass(frozen=True)
class Step:
    loss: float
    theta_grad: torch.Tensor
    logprob_grad: torch.Tensor
    logits_grad: torch.Tensor
    logprob: torch.Tensor
    weights: torch.Tensor
    delta_h: torch.Tensor
    metrics: dict[str, float]
    n_tokens: int


def train_step(
    name: str, batch: Batch, rollout_shift: torch.Tensor | None = None, **settings
) -> Step:
    """One strict step's loss and gradients through ``prepare`` and ``policy_loss``, the batch in
    two chunks. ``rollout_shift``: the rollout engine's logprobs are the trainer's minus it."""
    theta = batch.theta.clone().requires_grad_()
    logits = batch.features @ theta
    logits.retain_grad()
    log_p = torch.log_softmax(logits, dim=-1)
    logprob = log_p.gather(-1, batch.tokens[..., None]).squeeze(-1)
    logprob.retain_grad()
    entropy = -(log_p.exp() * log_p).sum(-1).detach()
    rows = [slice(0, CUT), slice(CUT, ROWS)]
    chunks = [
        TokenChunk(
            logprob[r].detach(),
            entropy[r],
            batch.advantages[r],
            batch.mask[r],
            rollout_logprob=None
            if rollout_shift is None
            else logprob[r].detach() - rollout_shift[r],
        )
        for r in rows
    ]
    objective = build_objective(method_config({"name": name, **settings}))
    prepared = prepare_step(objective, chunks, SingleProcessReducer())
    loss = sum(
        policy_loss(
            objective, logprob[r], batch.advantages[r], batch.mask[r], c, prepared.n_tokens
        ).loss
        for r, c in zip(rows, prepared.coefficients, strict=True)
    )
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    assert theta.grad is not None and logprob.grad is not None and logits.grad is not None
    return Step(
        loss=loss.item(),
        theta_grad=theta.grad,
        logprob_grad=logprob.grad,
        logits_grad=logits.grad,
        logprob=logprob.detach(),
        weights=torch.cat([c.weight for c in prepared.coefficients]),
        delta_h=torch.cat([c.delta_h for c in prepared.coefficients]),
        metrics=prepared.metrics,
        n_tokens=prepared.n_tokens,
    )


def kept(sign: int, a: float, valid: bool) -> bool:
    return valid and sign * a > 0


@pytest.mark.parametrize("name", sorted(SIGNS))
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_equal_float64_references(name, seed):
    batch = grouped_batch(seed)
    step = train_step(name, batch)
    sign = SIGNS[name]
    lp, adv, mask = step.logprob.tolist(), batch.advantages.tolist(), batch.mask.tolist()
    n = sum(map(sum, mask))
    assert step.n_tokens == n  # every response token counts, kept or not
    terms = [
        -adv[i][t] * lp[i][t]
        for i in range(ROWS)
        for t in range(LENGTH)
        if kept(sign, adv[i][t], mask[i][t])
    ]
    assert 0 < len(terms) < n
    # the kept terms −A log π share one sign (log π < 0): fp32 products and a sum of n terms,
    # (n + 3)·u₃₂ of the loss itself
    want = math.fsum(terms) / n
    assert abs(step.loss - want) <= (n + 3) * U32 * abs(want)

    # autograd of the explicit formula −Σ_kept A log π / n, float64, at the same logprobs
    lp64 = step.logprob.double().requires_grad_()
    a64 = batch.advantages.double()
    keep = batch.mask & (sign * a64 > 0)
    (-(a64 * lp64)[keep].sum() / n).backward()
    assert lp64.grad is not None
    # fp32: 1/n and its product with −w·A (w = 1 exactly), two roundings per element; exactly
    # 0 off the kept tokens
    error = (step.logprob_grad.double() - lp64.grad).abs()
    assert bool((error <= (2 * U32 + U32**2) * lp64.grad.abs()).all())
    assert bool((step.logprob_grad[~keep] == 0).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_two_signs_add_up_to_strict_grpo(seed):
    batch = grouped_batch(seed)
    correct, incorrect = train_step("correct_only", batch), train_step("incorrect_only", batch)
    strict = train_step("grpo_strict", batch)
    # per token: the kept side runs strict GRPO's operations on the same numbers (w = 1 exactly),
    # the other side is exactly 0, down to the logits' gradient
    assert torch.equal(correct.logprob_grad + incorrect.logprob_grad, strict.logprob_grad)
    assert torch.equal(correct.logits_grad + incorrect.logits_grad, strict.logits_grad)
    assert min(correct.theta_grad.abs().max(), incorrect.theta_grad.abs().max()) > 0
    # θ's gradient is featuresᵀ G summed over K tokens in fp32: each of the three carries at most
    # γ_K Σ_t |x_t||G_t| (Higham), their terms add up to strict GRPO's (disjoint tokens), and the
    # addition rounds once: 2γ_K S + u|g|, within (2K + 2)·u₃₂·S for K·u₃₂ ≪ 1
    k = ROWS * LENGTH
    x = batch.features.reshape(k, FEATURES).double().abs()
    scale = x.T @ strict.logits_grad.reshape(k, VOCAB).double().abs()
    error = (correct.theta_grad + incorrect.theta_grad - strict.theta_grad).double().abs()
    assert bool((error <= (2 * k + 2) * U32 * scale).all())
    # each loss: fp32 products and sums of at most K terms, (K + 3)·u₃₂ of its terms Σ|ℓ|/n;
    # strict GRPO's terms are both methods' (|correct| + |incorrect|, each of one sign)
    terms = abs(correct.loss) + abs(incorrect.loss)
    error = abs(correct.loss + incorrect.loss - strict.loss)
    assert error <= (2 * k + 7) * U32 * terms


@pytest.mark.parametrize(("name", "other"), [("correct_only", -1), ("incorrect_only", 1)])
def test_a_batch_of_the_other_sign_moves_nothing(name, other):
    """Advantages all of the sign the method drops (or zero): no gradient, zero loss; those of
    the sign it keeps: strict GRPO's step exactly."""
    g = torch.Generator().manual_seed(5)
    adv = torch.randn(ROWS, generator=g).abs() * other
    adv[::5] = 0.0
    dropped = signed_batch(g, adv)
    step = train_step(name, dropped)
    assert step.loss == 0.0
    assert bool((step.theta_grad == 0).all()) and bool((step.weights == 0).all())
    kept_batch = signed_batch(g, -adv)
    same, strict = train_step(name, kept_batch), train_step("grpo_strict", kept_batch)
    assert step.n_tokens == int(dropped.mask.sum())
    assert same.loss == strict.loss and torch.equal(same.theta_grad, strict.theta_grad)


@pytest.mark.parametrize("seed", [0, 3])
def test_metrics_read_the_applied_weights(seed):
    """spec §6: ``flow/net_after_balance = Σ_kept ΔH`` (the two add up to strict GRPO's
    ``P − N``), ``flow/adv_shift = Σ (w − 1) A / Σ|A|``: the dropped side's share of ``|A|``,
    ``+`` for ``correct_only`` and ``−`` for ``incorrect_only``, so the two shifts differ by
    exactly 1; P, N, λ* and the entropy are strict GRPO's."""
    batch = grouped_batch(seed)
    steps = {name: train_step(name, batch) for name in (*SIGNS, "grpo_strict")}
    strict = steps["grpo_strict"].metrics
    adv, mask = batch.advantages.double().flatten(), batch.mask.flatten()
    flows = strict["flow/pos"] + strict["flow/neg"]
    for name, sign in SIGNS.items():
        got = steps[name].metrics
        for key in ("flow/pos", "flow/neg", "flow/lambda", "entropy/mean"):
            assert got[key] == strict[key], (name, key)
        dh = steps[name].delta_h.flatten().tolist()  # ΔH itself: tests/core/test_reweighting.py
        adv_list, mask_list = adv.tolist(), mask.tolist()
        net = [d for d, a, m in zip(dh, adv_list, mask_list, strict=True) if kept(sign, a, m)]
        # float64 sums of the same fp32 ΔH in two orders: n·u₆₄ ≤ u₃₂ of P + N
        assert abs(got["flow/net_after_balance"] - math.fsum(net)) <= U32 * flows
        dropped = math.fsum(
            abs(a) for a, m in zip(adv_list, mask_list, strict=True) if kept(-sign, a, m)
        )
        total = math.fsum(abs(a) for a, m in zip(adv_list, mask_list, strict=True) if m)
        # float64 sums of exact products (w ∈ {0, 1}): n·u₆₄ ≤ u₃₂ of the scale 1
        assert abs(got["flow/adv_shift"] - sign * dropped / total) <= U32
    nets = sum(steps[name].metrics["flow/net_after_balance"] for name in SIGNS)
    assert abs(nets - strict["flow/net"]) <= 2 * U32 * flows
    shift = steps["correct_only"].metrics["flow/adv_shift"]
    assert 0 < shift < 1
    assert abs(shift - steps["incorrect_only"].metrics["flow/adv_shift"] - 1) <= 2 * U32


@pytest.mark.parametrize("name", sorted(SIGNS))
def test_rollout_is_cap_multiplies_the_kept_weights(name):
    batch = grouped_batch(4)
    shift = torch.linspace(-0.8, 0.8, ROWS * LENGTH).reshape(ROWS, LENGTH)
    step = train_step(name, batch, rollout_shift=shift, rollout_is_cap=1.5)
    keep = batch.mask & (SIGNS[name] * batch.advantages > 0)
    rollout = step.logprob - shift  # the fp32 logprobs the rollout engine reported
    cap = (step.logprob.double() - rollout.double()).exp().clamp(max=1.5)  # π_train / π_rollout
    want = torch.where(keep, cap, 0.0)
    weights = step.weights.reshape(ROWS, LENGTH).double()
    # the weight is the float64 value rounded to fp32 once
    assert bool(((weights - want).abs() <= U32 * want)[batch.mask].all())
    assert bool((weights[~keep & batch.mask] == 0).all()) and bool((want[keep] > 1).any())
    with pytest.raises(ValueError, match=r"method\.rollout_is_cap needs"):
        train_step(name, batch, rollout_is_cap=1.5)
