"""spec §2–§3: ΔH estimators, flow sums, λ* and weights against loop references and theory."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core import entropy_flow as ef
from tests.metric_bounds import U32, balanced_flow_bound

from . import reference as ref


def _random_tokens(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 12, generator=g, dtype=torch.float64) * 2
    log_probs = logits.log_softmax(-1)
    probs = log_probs.exp()
    targets = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    lp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    h = -(probs * log_probs).sum(-1)
    s2 = probs.square().sum(-1)
    s2l = (probs.square() * log_probs).sum(-1)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return lp.float(), h.float(), adv.float(), s2.float(), s2l.float()


def test_delta_entropy_matches_loop_reference_for_both_estimators():
    lp, h, adv, s2, s2l = _random_tokens(64)
    paper = ef.delta_entropy(lp, h, adv, "paper")
    tabular = ef.delta_entropy(lp, h, adv, "tabular", sum_p2=s2, sum_p2_logp=s2l)
    # ΔH is a difference (log p + H, p(log p + H) − (s2l + H s2)) of the same fp32 inputs: a
    # few fp32 roundings of the terms' magnitudes (1 − p carries p's rounding, u·p absolute)
    for i in range(64):
        args = float(lp[i]), float(h[i]), float(adv[i])
        p, a = math.exp(args[0]), abs(args[2])
        terms = a * (1 - p * p) * (abs(args[0]) + args[1])
        assert abs(paper[i].item() - ref.delta_h_paper(*args)) <= 8 * U32 * terms, i
        expected = ref.delta_h_tabular(*args, float(s2[i]), float(s2l[i]))
        terms = a * (p * (abs(args[0]) + args[1]) + abs(float(s2l[i])) + args[1] * float(s2[i]))
        assert abs(tabular[i].item() - expected) <= 8 * U32 * terms, i


def test_tabular_estimator_tracks_the_realized_entropy_change_of_a_small_step():
    """spec §2: (H(z') − H(z))/η after z' = z + η A (onehot(y) − π) matches `tabular`."""
    g = torch.Generator().manual_seed(1)
    draws, vocab, eta = 2000, 16, 1e-4
    logits = torch.randn(draws, vocab, generator=g, dtype=torch.float64) * 3
    probs = logits.softmax(-1)
    log_probs = logits.log_softmax(-1)
    y = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    adv = torch.randn(draws, generator=g, dtype=torch.float64)
    onehot = torch.nn.functional.one_hot(y, vocab).double()
    stepped = logits + eta * adv[:, None] * (onehot - probs)

    def entropy(z):
        return -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)

    realized = (entropy(stepped) - entropy(logits)) / eta
    lp = log_probs.gather(-1, y[:, None]).squeeze(-1)
    h = entropy(logits)
    s2 = probs.square().sum(-1)
    s2l = (probs.square() * log_probs).sum(-1)
    tabular = ef.delta_entropy(lp, h, adv, "tabular", sum_p2=s2, sum_p2_logp=s2l).double()
    paper = ef.delta_entropy(lp, h, adv, "paper").double()

    corr = torch.corrcoef(torch.stack([realized, tabular]))[0, 1]
    assert corr > 0.99
    assert torch.allclose(tabular, realized, rtol=1e-2, atol=1e-3)
    moving = realized.abs() > 1e-3
    sign_agreement = (paper[moving].sign() == realized[moving].sign()).double().mean()
    assert sign_agreement > 0.7, "paper estimator should agree in sign on most draws"
    assert not torch.allclose(paper, realized, rtol=1e-2, atol=1e-3), "paper is an approximation"


def test_full_expectation_of_the_paper_integrand_is_never_positive():
    """spec §2: Σ_a π(a)(1 − π(a))²(log π(a) + H) ≤ 0 for every distribution."""
    g = torch.Generator().manual_seed(2)
    for scale in (0.1, 1.0, 5.0, 20.0):
        logits = torch.randn(5000, 10, generator=g, dtype=torch.float64) * scale
        p = logits.softmax(-1)
        logp = logits.log_softmax(-1)
        h = -(p * logp).sum(-1, keepdim=True)
        expectation = (p * (1 - p).square() * (logp + h)).sum(-1)
        terms = (p * (1 - p).square() * (logp.abs() + h)).sum(-1)  # float64 round-off scale
        assert bool((expectation <= 16 * 2.0**-53 * terms).all()), scale


def _vocab_sums(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """fp32 ``logprob`` of a sampled token, ``entropy`` and the four vocabulary sums of
    ``softmax(logits)`` ``[n, V]``, computed in float64 and rounded once (as token_stats returns
    them)."""
    log_p = logits.double().log_softmax(-1)
    p = log_p.exp()
    y = p.argmin(-1)  # any token: the expectation estimator does not depend on it
    stats = {
        "logprob": log_p.gather(-1, y[:, None]).squeeze(-1),
        "entropy": -(p * log_p).sum(-1),
        "sum_p2": (p**2).sum(-1),
        "sum_p2_logp": (p**2 * log_p).sum(-1),
        "sum_p3": (p**3).sum(-1),
        "sum_p3_logp": (p**3 * log_p).sum(-1),
    }
    return {name: value.float() for name, value in stats.items()}


def _expectation_tol(stats: dict[str, torch.Tensor], adv: torch.Tensor) -> torch.Tensor:
    """fp32 error bound of ``−A[(s3l + H s3) − 2(s2l + H s2)]`` from inputs rounded to fp32
    (relative u each) and about eight fp32 operations: ``16 u |A| Σ|terms|``."""
    s = {name: value.double() for name, value in stats.items()}
    h = s["entropy"]
    terms = (
        s["sum_p3_logp"].abs() + h * s["sum_p3"] + 2 * (s["sum_p2_logp"].abs() + h * s["sum_p2"])
    )
    return 16 * 2.0**-24 * adv.double().abs() * terms


def test_expectation_estimator_matches_the_literal_vocabulary_sum():
    """spec §2: ``expectation`` from the four sums equals ``−A Σ_a π(1 − π)²(log π + H)`` summed
    term by term in float64, for peaked, flat and odd-sized vocabularies."""
    g = torch.Generator().manual_seed(4)
    for vocab, scale in ((7, 0.05), (13, 1.0), (31, 4.0), (50, 12.0)):
        logits = torch.randn(40, vocab, generator=g, dtype=torch.float64) * scale
        adv = torch.randn(40, generator=g)
        stats = _vocab_sums(logits)
        got = ef.delta_entropy(advantages=adv, estimator="expectation", **stats)
        assert got.dtype == torch.float32 and got.shape == (40,)
        tol = _expectation_tol(stats, adv)
        for i in range(40):
            want = ref.delta_h_expectation(logits[i].tolist(), float(adv[i]))
            assert abs(float(got[i]) - want) <= float(tol[i]) + 1e-12, (vocab, i)


def test_expectation_estimator_has_the_sign_of_the_advantage():
    """spec §2: ``Σ_a π(1 − π)²(log π + H) ≤ 0`` for every distribution, so ``expectation`` ΔH
    has the sign of A: ``ΔH · A ≥ 0`` up to its fp32 rounding, on random logits of every scale;
    it is 0 for a uniform distribution."""
    g = torch.Generator().manual_seed(5)
    for scale in (0.01, 0.3, 1.0, 5.0, 30.0):
        logits = torch.randn(3000, 11, generator=g, dtype=torch.float64) * scale
        adv = torch.randn(3000, generator=g)
        stats = _vocab_sums(logits)
        dh = ef.delta_entropy(advantages=adv, estimator="expectation", **stats).double()
        assert bool((dh * adv.double() >= -_expectation_tol(stats, adv) * adv.abs()).all()), scale
        assert float((dh * adv.double() > 0).double().mean()) > 0.9, scale
    uniform = _vocab_sums(torch.zeros(4, 9, dtype=torch.float64))
    flat = ef.delta_entropy(advantages=torch.ones(4), estimator="expectation", **uniform)
    assert bool((flat.double().abs() <= _expectation_tol(uniform, torch.ones(4))).all())


def test_estimator_sums_name_what_each_estimator_reads():
    """``ESTIMATOR_SUMS`` lists exactly the sums an estimator needs: with them it runs, without
    any one of them it fails naming the missing one."""
    stats = _vocab_sums(torch.randn(6, 9, generator=torch.Generator().manual_seed(6)))
    adv = torch.ones(6)
    base = {"logprob": stats["logprob"], "entropy": stats["entropy"], "advantages": adv}
    for estimator, needed in ef.ESTIMATOR_SUMS.items():
        ef.delta_entropy(**base, estimator=estimator, **{n: stats[n] for n in needed})
        for missing in needed:
            given = {n: stats[n] for n in needed if n != missing}
            with pytest.raises(ValueError, match=f"missing: {missing}$"):
                ef.delta_entropy(**base, estimator=estimator, **given)
    assert ef.ESTIMATOR_SUMS["paper"] == ()
    assert set(ef.ESTIMATOR_SUMS["expectation"]) == {
        "sum_p2",
        "sum_p2_logp",
        "sum_p3",
        "sum_p3_logp",
    }


def test_flow_sums_lambda_and_weights_match_loop_reference():
    g = torch.Generator().manual_seed(3)
    dh = torch.randn(200, generator=g)
    dh[::7] = 0.0
    mask = torch.rand(200, generator=g) > 0.3
    pos, neg = ef.flow_sums(dh, mask)
    ref_pos, ref_neg = ref.flow(dh.tolist(), mask.tolist())
    assert float(pos) == pytest.approx(ref_pos, rel=1e-6)
    assert float(neg) == pytest.approx(ref_neg, rel=1e-6)
    for variant in ef.BALANCES:
        w, lam = ef.balance(dh, mask, pos, neg, variant, static_lambda=0.05, shift=0.2)
        shift = 0.2 if variant == "target" else 0.0
        expected = ref.weights(dh.tolist(), mask.tolist(), ref_pos, ref_neg, variant, 0.05, shift)
        assert w.tolist() == pytest.approx(expected, rel=1e-6)
        expected_lam = 0.05 if variant == "static" else ref.lam_star(ref_pos, ref_neg) + shift
        # scale 1 (tests/metric_bounds.py); float64 sums of 200 terms in two orders
        assert float(lam) == pytest.approx(expected_lam, rel=0, abs=len(dh) * 2.0**-52)


def test_group_flow_sums_are_each_groups_loop_reference():
    g = torch.Generator().manual_seed(5)
    dh = torch.randn(9, 2, 7, generator=g)
    mask = torch.rand(9, 2, 7, generator=g) > 0.3
    groups = torch.tensor([2, 0, 2, 3, 0, 0, 2, 3, 3])  # group 1 has no row: P_1 = N_1 = 0
    pos, neg = ef.group_flow_sums(dh, mask, groups, 4)
    assert pos.dtype == neg.dtype == torch.float64 and tuple(pos.shape) == (4,)
    for group in range(4):
        rows = [r for r in range(9) if groups[r] == group]
        ref_pos, ref_neg = ref.flow(dh[rows].flatten().tolist(), mask[rows].flatten().tolist())
        # float64 sums of the same fp32 values in two orders: n·u₆₄ of Σ|ΔH| at worst
        scale = max(len(rows), 1) * 14 * 2.0**-53 * float(dh[rows].abs().sum())
        assert abs(float(pos[group]) - ref_pos) <= scale
        assert abs(float(neg[group]) - ref_neg) <= scale
    assert float(pos[1]) == float(neg[1]) == 0.0
    whole_pos, whole_neg = ef.flow_sums(dh, mask)
    bound = dh.numel() * 2.0**-53 * float(dh.abs().sum())
    assert abs(float(pos.sum() - whole_pos)) <= bound and abs(float(neg.sum() - whole_neg)) <= bound
    with pytest.raises(ValueError, match="groups must be integers of shape"):
        ef.group_flow_sums(dh, mask, groups[:8], 4)
    with pytest.raises(IndexError):
        ef.group_flow_sums(dh, mask, groups, 3)


@pytest.mark.parametrize("seed", range(4))
def test_target_balance_is_adaptive_at_the_target_and_pushes_toward_it(seed):
    g = torch.Generator().manual_seed(seed)
    dh = torch.randn(300, generator=g) * torch.rand(300, generator=g)
    mask = torch.rand(300, generator=g) > 0.2
    pos, neg = ef.flow_sums(dh, mask)
    total = float(pos + neg)
    adaptive, _ = ef.balance(dh, mask, pos, neg, "adaptive")
    at_target = ef.target_shift(mean_entropy=0.8, target_entropy=0.8, gain=2.0)
    same, _ = ef.balance(dh, mask, pos, neg, "target", shift=at_target)
    assert torch.equal(same, adaptive)
    fp32 = torch.finfo(torch.float32).eps * total  # the weights are fp32
    for batch_entropy, sign in ((0.6, 1.0), (1.0, -1.0)):  # below the target: raise it
        shift = ef.target_shift(batch_entropy, target_entropy=0.8, gain=0.5)
        w, lam = ef.balance(dh, mask, pos, neg, "target", shift=shift)
        net = float((w.double() * dh.double() * mask).sum())
        assert sign * net > 0
        if abs(float(lam)) < 1:  # unclipped: the predicted net flow is g (H* − H)(P + N)
            assert net == pytest.approx(shift * total, abs=4 * fp32)
    huge = ef.target_shift(0.0, target_entropy=10.0, gain=1.0)
    w, lam = ef.balance(dh, mask, pos, neg, "target", shift=huge)
    assert float(lam) == 1.0  # clipped: S− gets weight 0, S+ weight 2
    assert set(w[mask & (dh < 0)].tolist()) <= {0.0} and set(w[mask & (dh > 0)].tolist()) <= {2.0}


def test_adaptive_balance_zeroes_the_net_flow_and_keeps_zero_change_tokens_at_one():
    dh = torch.tensor([0.5, -2.0, 0.0, 1.0, -0.25, 0.0])
    mask = torch.ones(6, dtype=torch.bool)
    pos, neg = ef.flow_sums(dh, mask)
    w, lam = ef.balance(dh, mask, pos, neg, "adaptive")
    net = float((w.double() * dh.double()).sum())
    assert abs(net) <= balanced_flow_bound({"flow/pos": float(pos), "flow/neg": float(neg)})
    assert w[2] == 1.0 and w[5] == 1.0
    assert float(lam) == pytest.approx((2.25 - 1.5) / 3.75)


def test_no_flow_gives_lambda_zero_and_unit_weights():
    dh = torch.zeros(5)
    mask = torch.ones(5, dtype=torch.bool)
    pos, neg = ef.flow_sums(dh, mask)
    w, lam = ef.balance(dh, mask, pos, neg, "adaptive")
    assert float(lam) == 0.0
    assert torch.equal(w, torch.ones(5))
    assert not math.isnan(float(ef.lambda_star(0.0, 0.0)))


def test_statistics_carry_no_gradient():
    lp, h, adv, _, _ = _random_tokens(16)
    lp.requires_grad_()
    h.requires_grad_()
    dh = ef.delta_entropy(lp, h, adv)
    assert not dh.requires_grad
    pos, neg = ef.flow_sums(dh, torch.ones(16, dtype=torch.bool))
    w, lam = ef.balance(dh, torch.ones(16, dtype=torch.bool), pos, neg)
    assert not (pos.requires_grad or w.requires_grad or lam.requires_grad)


def test_unknown_estimator_and_balance_are_rejected_by_name():
    lp, h, adv, _, _ = _random_tokens(4)
    with pytest.raises(ValueError, match="estimator 'exact'"):
        ef.delta_entropy(lp, h, adv, "exact")
    with pytest.raises(ValueError, match="needs sum_p2"):
        ef.delta_entropy(lp, h, adv, "tabular")
    with pytest.raises(ValueError, match="balance 'both'"):
        ef.balance(torch.ones(2), torch.ones(2), 1.0, 0.0, "both")
