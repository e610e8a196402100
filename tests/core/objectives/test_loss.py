"""spec §5: per-token losses, the global token mean, gradients and the paper's Fig. 3 listing."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import (
    Objective,
    TokenChunk,
    build_objective,
    method_config,
    policy_loss,
    prepare,
)
from opefo_nemo.core.objectives.methods.covariance import token_uniform
from tests.core import reference as ref
from tests.core.chunks import METHOD_SETTINGS, batch, method
from tests.metric_bounds import U32, assert_close_to_scale, balanced_flow_bound, term_scale


def loop_token_loss(name: str, objective: Objective, i: int, c: TokenChunk, w: float, sel: bool):
    """ℓ_t of spec §5 for token i, written from the table with scalars only."""
    cfg = objective.config
    lp, a = float(c.logprob[i]), float(c.advantages[i])
    old = lp if c.old_logprob is None else float(c.old_logprob[i])
    rho = math.exp(lp - old)
    if name != "kl_cov" and cfg.updates_per_rollout > 1:
        clipped = min(max(rho, 1 - cfg.clip_eps_low), 1 + cfg.clip_eps_high)
        surrogate = max(-a * rho, -a * clipped)
        if a < 0 and cfg.clip_ratio_c is not None:
            surrogate = min(surrogate, -cfg.clip_ratio_c * a)
    if name in ("grpo", "clip_higher"):
        return surrogate
    if name == "steer":
        return w * surrogate
    if name == "entropy_reg":
        return surrogate - objective.coef * float(c.entropy[i])
    if name == "clip_cov":
        return 0.0 if sel else surrogate
    if name == "kl_cov":
        return -a * rho + (cfg.kl_cov.coef * abs(lp - old) if sel else 0.0)
    return -w * a * lp


@pytest.mark.parametrize("name", sorted(METHOD_SETTINGS))
def test_loss_of_every_method_matches_loop_reference(name):
    cfg = method(name)
    chunk = batch(multi_update=not cfg.config.strict_on_policy)
    prepared = prepare(cfg, [chunk], SingleProcessReducer(), seed=3)
    coef = prepared.coefficients[0]
    lp = chunk.logprob.clone().requires_grad_()
    ent = chunk.entropy.clone().requires_grad_()
    out = policy_loss(
        cfg,
        lp,
        chunk.advantages,
        chunk.mask,
        coef,
        prepared.n_tokens,
        old_logprob=chunk.old_logprob,
        entropy=ent,
    )
    n = int(chunk.mask.sum())
    assert prepared.n_tokens == n
    terms = [
        loop_token_loss(name, cfg, i, chunk, float(coef.weight[i]), bool(coef.selected[i]))
        for i in range(len(chunk.mask))
        if chunk.mask[i]
    ]
    # a sum of terms of both signs: fp32 round-off of order n·u₃₂ of Σ|ℓ_t|, scaled by them
    scale = math.fsum(abs(t) for t in terms) / n
    assert out.loss.item() == pytest.approx(math.fsum(terms) / n, rel=0, abs=1e-5 * scale)


def test_paper_listing_fig3_equals_opefo_loss_on_one_unmasked_chunk():
    """The paper's compute_opefo_loss, re-typed independently here, on a batch without mask."""
    chunk = batch(n=128, seed=5)
    chunk = TokenChunk(chunk.logprob, chunk.entropy, chunk.advantages, torch.ones(128, dtype=bool))
    cfg = method("opefo")
    prepared = prepare(cfg, [chunk], SingleProcessReducer())
    delta_h = torch.tensor(
        [
            ref.delta_h_paper(float(lp), float(h), float(a))
            for lp, h, a in zip(chunk.logprob, chunk.entropy, chunk.advantages, strict=True)
        ]
    )
    pg_terms = -chunk.logprob * chunk.advantages
    s_pos, s_neg = delta_h > 0, delta_h < 0
    pos_mag, neg_mag = delta_h[s_pos].sum(), delta_h[s_neg].abs().sum()
    lambda_s = (neg_mag - pos_mag) / (neg_mag + pos_mag).clamp_min(1e-12)
    pg_terms[s_pos] *= 1.0 + lambda_s
    pg_terms[s_neg] *= 1.0 - lambda_s
    listing = pg_terms.mean()

    out = policy_loss(
        cfg, chunk.logprob, chunk.advantages, chunk.mask, prepared.coefficients[0], 128
    )
    # fp32 sums of terms of both signs (scale Σ|terms|/n); λ* has scale 1 (tests/metric_bounds.py)
    scale = float(pg_terms.abs().mean())
    assert out.loss.item() == pytest.approx(listing.item(), rel=0, abs=1e-5 * scale)
    assert prepared.lambda_star == pytest.approx(lambda_s.item(), rel=0, abs=1e-5)


def test_opefo_gradient_wrt_logprob_is_minus_weight_times_advantage_over_n():
    chunk = batch(seed=7)
    cfg = method("opefo")
    prepared = prepare(cfg, [chunk], SingleProcessReducer())
    coef = prepared.coefficients[0]
    lp = chunk.logprob.clone().requires_grad_()
    policy_loss(cfg, lp, chunk.advantages, chunk.mask, coef, prepared.n_tokens).loss.backward()
    expected = torch.where(chunk.mask, -coef.weight * chunk.advantages / prepared.n_tokens, 0.0)
    assert_close_to_scale(lp.grad, expected, rel=4 * U32)  # a few fp32 roundings per element
    assert not coef.weight.requires_grad and not coef.delta_h.requires_grad


def test_opefo_balances_flow_and_logs_metrics():
    prepared = prepare(method("opefo"), [batch(seed=9)], SingleProcessReducer())
    m = prepared.metrics
    # zero by construction, up to the fp32 rounding of the applied weights 1 ± λ*
    assert abs(m["flow/net_after_balance"]) <= balanced_flow_bound(m)
    assert -1 <= m["flow/lambda"] <= 1
    assert m["flow/net"] == m["flow/pos"] - m["flow/neg"]
    strict = prepare(method("grpo_strict"), [batch(seed=9)], SingleProcessReducer()).metrics
    assert strict["flow/lambda"] == m["flow/lambda"]
    # Σ ΔH against P − N: float64 sums in two orders, n·u₆₄ ≤ u₃₂ of the terms P + N
    bound = U32 * term_scale("flow/net", strict)
    assert strict["flow/net_after_balance"] == pytest.approx(strict["flow/net"], rel=0, abs=bound)


def test_kl_cov_selects_the_top_tokens_by_covariance():
    cfg = method("kl_cov")
    chunk = batch(n=200, seed=11, multi_update=True)
    selected = prepare(cfg, [chunk], SingleProcessReducer()).coefficients[0].selected
    valid = [i for i in range(200) if chunk.mask[i]]
    a_mean = sum(float(chunk.advantages[i]) for i in valid) / len(valid)
    l_mean = sum(float(chunk.logprob[i]) for i in valid) / len(valid)
    cov = {
        i: (float(chunk.advantages[i]) - a_mean) * (float(chunk.logprob[i]) - l_mean) for i in valid
    }
    k = max(int(cfg.config.kl_cov.ratio * len(valid)), 1)
    top = sorted(valid, key=lambda i: -cov[i])[:k]
    assert sorted(selected.nonzero().flatten().tolist()) == sorted(top)


def test_clip_cov_picks_k_random_candidates_in_the_window_and_skips_clipped_tokens():
    cfg = build_objective(
        method_config(
            {
                "name": "clip_cov",
                "updates_per_rollout": 8,
                "clip_cov": {"ratio": 0.05, "lb": -0.3, "ub": 0.6},
            }
        )
    )
    chunk = batch(n=400, seed=13, multi_update=True)
    selected = prepare(cfg, [chunk], SingleProcessReducer(), seed=21).coefficients[0].selected
    valid = [i for i in range(400) if chunk.mask[i]]
    a_mean = sum(float(chunk.advantages[i]) for i in valid) / len(valid)
    l_mean = sum(float(chunk.logprob[i]) for i in valid) / len(valid)
    candidates = []
    for i in valid:
        cov = (float(chunk.advantages[i]) - a_mean) * (float(chunk.logprob[i]) - l_mean)
        rho = math.exp(float(chunk.logprob[i]) - float(chunk.old_logprob[i]))
        a = float(chunk.advantages[i])
        clipped = (a > 0 and rho > 1.2) or (a < 0 and rho < 0.8)
        if -0.3 < cov < 0.6 and not clipped:
            candidates.append(i)
    u = token_uniform(chunk.token_ids, 21)
    k = max(int(0.05 * len(valid)), 1)
    expected = sorted(candidates, key=lambda i: -float(u[i]))[:k]
    assert len(candidates) > k
    assert sorted(selected.nonzero().flatten().tolist()) == sorted(expected)


def test_token_uniform_is_deterministic_and_roughly_uniform():
    ids = torch.arange(20000) * 7919 + 3
    u = token_uniform(ids, 5)
    assert torch.equal(u, token_uniform(ids, 5))
    assert not torch.equal(u, token_uniform(ids, 6))
    assert ((u >= 0) & (u < 1)).all()
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert counts.min() > 1700 and counts.max() < 2300


def test_all_zero_advantages_give_zero_loss_and_lambda_without_nan():
    chunk = batch(seed=15)
    chunk = TokenChunk(chunk.logprob, chunk.entropy, torch.zeros_like(chunk.advantages), chunk.mask)
    cfg = method("opefo")
    prepared = prepare(cfg, [chunk], SingleProcessReducer())
    out = policy_loss(
        cfg,
        chunk.logprob,
        chunk.advantages,
        chunk.mask,
        prepared.coefficients[0],
        prepared.n_tokens,
    )
    assert prepared.lambda_star == 0.0
    assert out.loss.item() == 0.0
    assert all(math.isfinite(v) for v in prepared.metrics.values())


def test_prepare_refuses_missing_reducer_single_chunk_and_empty_batch():
    chunk = batch()
    cfg = method("opefo")
    with pytest.raises(TypeError, match="BatchReducer"):
        prepare(cfg, [chunk], None)
    with pytest.raises(TypeError, match="sequence of TokenChunk"):
        prepare(cfg, chunk, SingleProcessReducer())
    empty = TokenChunk(chunk.logprob, chunk.entropy, chunk.advantages, torch.zeros(96, dtype=bool))
    with pytest.raises(ValueError, match="no valid response token"):
        prepare(cfg, [empty], SingleProcessReducer())


def test_bad_inputs_name_the_tensor_the_count_and_the_index():
    lp = -torch.rand(4, 5)
    lp[2, 3] = float("nan")
    lp[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"logprob has 2 non-finite value\(s\).*index \(2, 3\)"):
        TokenChunk(lp, torch.rand(4, 5), torch.randn(4, 5), torch.ones(4, 5))
    with pytest.raises(
        ValueError, match=r"entropy has shape \(4, 4\) but logprob has shape \(4, 5\)"
    ):
        TokenChunk(-torch.rand(4, 5), torch.rand(4, 4), torch.randn(4, 5), torch.ones(4, 5))
    chunk = batch()
    prepared = prepare(method("opefo"), [chunk], SingleProcessReducer())
    with pytest.raises(ValueError, match="strict on-policy"):
        policy_loss(
            method("opefo"),
            chunk.logprob,
            chunk.advantages,
            chunk.mask,
            prepared.coefficients[0],
            10,
            old_logprob=chunk.logprob,
        )


def test_clip_cov_default_loss_is_cui_et_al_s_without_a_dual_clip():
    """``clip_cov`` as configured by default (conf/method/clip_cov.yaml) against Cui et al.'s
    Clip-Cov loss, ``max(−A ρ, −A clip(ρ, 1 − ε, 1 + ε))`` on the unselected tokens with no cap at
    ``−c A``, on heavy-tailed ratios (ρ up to e³) where a dual clip at c = 3 would cap it."""
    from opefo_nemo.config import load_method
    from opefo_nemo.core.objectives import Coefficients

    objective = build_objective(load_method("clip_cov"))
    g = torch.Generator().manual_seed(21)
    n = 400
    old = -torch.rand(n, generator=g) * 3
    logprob = old + torch.randn(n, generator=g).abs() * 1.5  # ρ ≥ 1, heavy upper tail
    adv = torch.randn(n, generator=g)
    mask = torch.rand(n, generator=g) > 0.1
    selected = torch.zeros(n, dtype=torch.bool)
    coefficients = Coefficients(torch.zeros(n), torch.ones(n), selected)
    tokens = int(mask.sum())
    out = policy_loss(objective, logprob, adv, mask, coefficients, tokens, old_logprob=old)

    rho = (logprob.double() - old.double()).exp()
    a = adv.double()
    eps_low, eps_high = objective.config.clip_eps_low, objective.config.clip_eps_high
    per_token = torch.maximum(-a * rho, -a * rho.clamp(1 - eps_low, 1 + eps_high))
    assert bool(((a < 0) & (rho > 3) & mask).any())  # tokens a dual clip at c = 3 would cap
    want = float((per_token * mask).sum() / tokens)
    scale = float((per_token.abs() * mask).sum() / tokens)  # terms of both signs
    assert out.loss.item() == pytest.approx(want, rel=0, abs=1e-5 * scale)
