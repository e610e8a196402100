"""spec §6 on-policy fidelity and the predictor-quality correlation, against loops and numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opefo_nemo.core.fidelity import fidelity_metrics, fidelity_sums, truncated_is_weight
from opefo_nemo.core.metrics import RunningCorrelation, add_sums


def _tokens(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    train = -torch.rand(n, generator=g) * 5
    rollout = train + torch.randn(n, generator=g) * 0.3
    mask = torch.rand(n, generator=g) > 0.3
    return train, rollout, mask


def test_fidelity_metrics_match_a_loop_and_add_over_chunks():
    train, rollout, mask = _tokens(500, seed=1)
    deltas = [float(t) - float(r) for t, r, m in zip(train, rollout, mask, strict=True) if m]
    want = {
        "fidelity/abs_logprob_diff": sum(abs(d) for d in deltas) / len(deltas),
        "fidelity/kl": sum(math.exp(d) - 1 - d for d in deltas) / len(deltas),
        "fidelity/mult_prob_error": sum(math.exp(abs(d)) for d in deltas) / len(deltas),
        "fidelity/frac_beyond": sum(abs(d) > 0.25 for d in deltas) / len(deltas),
    }
    sums: dict = {}
    for part in (slice(0, 123), slice(123, 500)):
        sums = add_sums(sums, fidelity_sums(train[part], rollout[part], mask[part], 0.25))
    got = fidelity_metrics(sums)
    # fp32 inputs, float64 arithmetic: the loop sees the same fp32 values, round-off ~1e-15
    assert got == pytest.approx(want, rel=1e-12)
    assert 0 < got["fidelity/frac_beyond"] < 1 and got["fidelity/kl"] > 0


def test_identical_logprobs_are_perfect_fidelity_and_unit_weights():
    train, _, mask = _tokens(64, seed=2)
    got = fidelity_metrics(fidelity_sums(train, train.clone(), mask, 0.1))
    assert got == {
        "fidelity/abs_logprob_diff": 0.0,
        "fidelity/kl": 0.0,
        "fidelity/mult_prob_error": 1.0,
        "fidelity/frac_beyond": 0.0,
    }
    assert torch.equal(truncated_is_weight(train, train, cap=2.0), torch.ones(64))


def test_truncated_is_weight_is_the_capped_probability_ratio():
    train, rollout, _ = _tokens(200, seed=3)
    got = truncated_is_weight(train, rollout, cap=1.2)
    want = [min(math.exp(float(t) - float(r)), 1.2) for t, r in zip(train, rollout, strict=True)]
    assert got.tolist() == pytest.approx(want, rel=1e-6)  # fp32 result
    assert float(got.max()) == pytest.approx(1.2) and not got.requires_grad


@pytest.mark.parametrize("seed", range(3))
def test_running_correlation_equals_numpy_and_survives_a_checkpoint(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=40) * 1e-3
    y = 0.7 * x + rng.normal(size=40) * 5e-4
    run, resumed = RunningCorrelation(), RunningCorrelation()
    assert run.value() is None
    for i, (a, b) in enumerate(zip(x, y, strict=True)):
        run.add(float(a), float(b))
        if i == 19:
            resumed.load_state_dict(run.state_dict())
        elif i > 19:
            resumed.add(float(a), float(b))
    want = float(np.corrcoef(x, y)[0, 1])
    assert run.value() == pytest.approx(want, rel=1e-10)
    assert resumed.value() == pytest.approx(want, rel=1e-10)
    constant = RunningCorrelation()
    for b in y[:5]:
        constant.add(0.0, float(b))
    assert constant.value() is None
