"""``steer`` equals STEER's published token weights and loss on STEER's conventions.

The reference below is an independent scalar re-implementation, in float64 with loops over tokens,
of the token-weighting and policy-loss functions released with "Rethinking Entropy Interventions
in RLVR: An Entropy Change Perspective", on that code's conventions:

* the weights are computed inside the loss of each micro-batch, from that micro-batch's valid
  tokens only: ``x = clamp(exp(log_prob), 1e-8, 1 − 1e-8)`` with ``log_prob`` the *current*
  policy's, ``Ω = A / clamp(exp(old_log_prob), 1e-8, 1) · x(1 − x)(log x + H)`` with ``H`` the
  entropy recorded when the old log-probabilities were computed (the rollout policy's), a
  non-finite ``Ω`` set to 0, then ``|Ω|``;
* linear: ``w = w_max − (|Ω| − min)(w_max − w_min)/(max − min)`` clamped to ``[w_min, w_max]``,
  the midpoint when ``max = min``; exponential: ``k = −ln(w_min) / max(max, 0.02)``,
  ``w = clamp(exp(−k|Ω|), w_min, 1)``; padding gets 0;
* the per-token loss is the dual-clip PPO loss (``max(−Aρ, −A clip(ρ, 1 − ε_low, 1 + ε_high))``,
  for ``A < 0`` at most ``−cA``) times ``w``; that code also clamps ``log ρ`` to ``[−20, 20]``,
  which these inputs never reach.

The aggregation differs by design: STEER's code averages over each micro-batch's tokens, this
product over the whole optimizer-step batch's (spec §5), so the test compares the weights and
per-token losses token by token and the step loss against the sum of the reference's terms over
the global count.
"""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import TokenChunk, build_objective, method_config, policy_loss
from opefo_nemo.core.objectives import prepare as prepare_step
from opefo_nemo.core.objectives.tokens import LossInputs
from tests.metric_bounds import U32

EPS_LOW, EPS_HIGH, DUAL_C = 0.2, 0.28, 10.0


def reference_weights(tokens, linear: bool, w_min: float, w_max: float) -> list[float]:
    """STEER's weights of one micro-batch; ``tokens``: ``(logprob, old_logprob, A, H_old,
    valid)`` tuples of floats."""
    magnitudes = []
    for logprob, old_logprob, adv, entropy, _ in tokens:
        x = min(max(math.exp(logprob), 1e-8), 1 - 1e-8)
        old = min(max(math.exp(old_logprob), 1e-8), 1.0)
        omega = adv / old * (x * (1 - x) * (math.log(x) + entropy))
        magnitudes.append(abs(omega) if math.isfinite(omega) else 0.0)
    valid = [m for m, t in zip(magnitudes, tokens, strict=True) if t[4]]
    low, high = min(valid), max(valid)
    weights = []
    for m, t in zip(magnitudes, tokens, strict=True):
        if not t[4]:
            weights.append(0.0)
        elif linear:
            w = w_max - (m - low) * (w_max - w_min) / (high - low) if high > low else None
            w = (w_min + w_max) / 2 if w is None else w
            weights.append(min(max(w, w_min), w_max))
        else:
            k = -math.log(w_min) / max(high, 0.02)
            weights.append(min(max(math.exp(-k * m), w_min), 1.0))
    return weights


def reference_token_loss(logprob: float, old_logprob: float, adv: float, weight: float) -> float:
    ratio = math.exp(logprob - old_logprob)
    bounded = min(max(ratio, 1 - EPS_LOW), 1 + EPS_HIGH)
    clipped = max(-adv * ratio, -adv * bounded)
    if adv < 0:
        clipped = min(clipped, -adv * DUAL_C)
    return clipped * weight


def micro_batches(seed: int) -> list[TokenChunk]:
    """Five micro-batches of 3 × 7 tokens with STEER's edge cases: a certain token (π = 1,
    clamped), tokens far outside the clip range (ρ up to e³, the dual clip's cap active), zero
    advantages, an all-zero-advantage micro-batch (every |Ω| = 0: the midpoint), one of tiny
    advantages (its largest |Ω| below the exponential mapping's floor 0.02), padding."""
    g = torch.Generator().manual_seed(seed)
    chunks = []
    for index in range(5):
        shape = (3, 7)
        old = -torch.rand(shape, generator=g) * 4
        logprob = (old + torch.randn(shape, generator=g) * 1.2).clamp(max=0.0)
        logprob[0, 0] = 0.0
        adv = torch.randn(3, 1, generator=g).expand(shape).clone()
        adv[2] = 0.0
        if index == 3:
            adv.zero_()
        if index == 4:
            adv *= 1e-3
        mask = torch.rand(shape, generator=g) > 0.2
        mask[0, :2] = True
        chunks.append(
            TokenChunk(
                logprob=logprob,
                entropy=torch.rand(shape, generator=g) * 3,  # the current policy's: unused
                advantages=adv,
                mask=mask,
                old_logprob=old,
                token_ids=torch.arange(21).reshape(shape) + 21 * index,
                old_entropy=torch.rand(shape, generator=g) * 3,
            )
        )
    return chunks


def reference_tokens(chunk: TokenChunk) -> list[tuple[float, float, float, float, bool]]:
    assert chunk.old_logprob is not None and chunk.old_entropy is not None
    columns = (chunk.logprob, chunk.old_logprob, chunk.advantages, chunk.old_entropy)
    flat = [c.reshape(-1).tolist() for c in columns]
    return [(*values, bool(v)) for *values, v in zip(*flat, chunk.mask.reshape(-1), strict=True)]


def steer(scope: str, mapping: str, w_max: float):
    settings = {"scope": scope, "mapping": mapping, "weight_min": 0.8, "weight_max": w_max}
    return build_objective(method_config({"name": "steer", "steer": settings}))


@pytest.mark.parametrize("scope", ["micro_batch", "batch"])
@pytest.mark.parametrize(("mapping", "w_max"), [("linear", 1.2), ("exponential", 1.0)])
def test_weights_and_loss_equal_steers_published_function(scope, mapping, w_max):
    objective = steer(scope, mapping, w_max)
    assert objective.config.clip_eps_high == EPS_HIGH and objective.config.clip_ratio_c == DUAL_C
    chunks = micro_batches(seed=3)
    prepared = prepare_step(objective, chunks, SingleProcessReducer())
    # STEER's code on each micro-batch (scope micro_batch), or on the whole batch as its one
    # micro-batch (scope batch)
    if scope == "micro_batch":
        groups = [reference_tokens(c) for c in chunks]
        want = [reference_weights(g, mapping == "linear", 0.8, w_max) for g in groups]
    else:
        whole = [t for c in chunks for t in reference_tokens(c)]
        weights = reference_weights(whole, mapping == "linear", 0.8, w_max)
        want = [weights[21 * i : 21 * (i + 1)] for i in range(len(chunks))]
    if scope == "micro_batch" and mapping == "linear":
        assert set(want[3]) <= {0.0, 1.0}  # the all-zero micro-batch: the midpoint
    total, terms = 0.0, 0.0
    for chunk, coefficients, expected in zip(chunks, prepared.coefficients, want, strict=True):
        valid = chunk.mask.reshape(-1)
        got = coefficients.weight.reshape(-1).double()[valid]
        expected_valid = torch.tensor(expected, dtype=torch.float64)[valid]
        # fp32 weights of magnitude ≤ 1.2 from float64 arithmetic: one rounding each
        torch.testing.assert_close(got, expected_valid, rtol=0, atol=2 * U32)
        inputs = LossInputs(
            logprob=chunk.logprob,
            old_logprob=chunk.old_logprob,
            advantages=chunk.advantages,
            weight=coefficients.weight,
            selected=coefficients.selected,
        )
        per_token = objective.token_loss(inputs).reshape(-1).double()[valid]
        reference = [
            reference_token_loss(lp, old, a, w)
            for (lp, old, a, _, v), w in zip(reference_tokens(chunk), expected, strict=True)
            if v
        ]
        reference_t = torch.tensor(reference, dtype=torch.float64)
        # each term: a few fp32 roundings (exp, products) of its own magnitude
        torch.testing.assert_close(per_token, reference_t, rtol=8 * U32, atol=0)
        share = policy_loss(
            objective,
            chunk.logprob,
            chunk.advantages,
            chunk.mask,
            coefficients,
            prepared.n_tokens,
            old_logprob=chunk.old_logprob,
        ).loss
        total += float(share)
        terms += math.fsum(abs(r) for r in reference)
    n = prepared.n_tokens
    want_loss = math.fsum(
        reference_token_loss(lp, old, a, w)
        for chunk, expected in zip(chunks, want, strict=True)
        for (lp, old, a, _, v), w in zip(reference_tokens(chunk), expected, strict=True)
        if v
    )
    # fp32 sums of terms of both signs over the chunks: n·u₃₂ of Σ|ℓ_t| / n
    assert total == pytest.approx(want_loss / n, rel=0, abs=n * U32 * terms / n)
    valid_weights = [
        w
        for c, e in zip(chunks, want, strict=True)
        for w, v in zip(e, c.mask.reshape(-1).tolist(), strict=True)
        if v
    ]
    assert prepared.metrics["steer/weight_mean"] == pytest.approx(
        math.fsum(valid_weights) / n, rel=0, abs=2 * U32
    )


def test_the_mapping_reads_the_rollout_policys_entropy_and_the_current_probability():
    """Changing the current entropy moves nothing; changing the rollout policy's does."""
    objective = steer("batch", "linear", 1.2)
    chunks = micro_batches(seed=5)
    base = prepare_step(objective, chunks, SingleProcessReducer()).coefficients
    other_current = [TokenChunk(**{**c.__dict__, "entropy": c.entropy.flip(0)}) for c in chunks]
    same = prepare_step(objective, other_current, SingleProcessReducer()).coefficients
    for a, b in zip(base, same, strict=True):
        assert torch.equal(a.weight, b.weight)
    assert chunks[0].old_entropy is not None
    other_old = [TokenChunk(**{**c.__dict__, "old_entropy": c.old_entropy.flip(0)}) for c in chunks]
    moved = prepare_step(objective, other_old, SingleProcessReducer()).coefficients
    assert any(not torch.equal(a.weight, b.weight) for a, b in zip(base, moved, strict=True))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"scope": "rank"}, r"method\.steer\.scope is 'rank'"),
        ({"mapping": "log"}, r"method\.steer\.mapping is 'log'"),
        ({"weight_min": 0.0}, r"method\.steer\.weight_min must lie in \(0, weight_max"),
        ({"weight_min": 1.3}, r"method\.steer\.weight_min must lie in \(0, weight_max"),
        ({"mapping": "exponential"}, r"method\.steer\.weight_max is 1\.2 .* exponential"),
    ],
)
def test_bad_settings_fail_naming_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        method_config({"name": "steer", "steer": override})


def test_a_micro_batch_without_valid_tokens_keeps_neutral_weights_and_the_rest_their_own():
    chunks = micro_batches(seed=8)
    empty = TokenChunk(**{**chunks[0].__dict__, "mask": torch.zeros_like(chunks[0].mask)})
    objective = steer("micro_batch", "linear", 1.2)
    with_empty = prepare_step(objective, [empty, *chunks[1:]], SingleProcessReducer())
    without = prepare_step(objective, chunks[1:], SingleProcessReducer())
    assert torch.equal(with_empty.coefficients[0].weight, torch.ones(3, 7))
    for a, b in zip(with_empty.coefficients[1:], without.coefficients, strict=True):
        assert torch.equal(a.weight, b.weight)
    no_ids = [TokenChunk(**{**c.__dict__, "token_ids": None}) for c in chunks]
    with pytest.raises(ValueError, match=r"steer needs TokenChunk\.token_ids"):
        prepare_step(objective, no_ids, SingleProcessReducer())
