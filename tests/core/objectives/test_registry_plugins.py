"""Methods as plug-ins: the docs' example method runs as written; closed-loop methods keep and
restore their state; every step's coefficients match a brute-force reference."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.config import load_method
from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import (
    TokenChunk,
    build_objective,
    method_config,
    policy_loss,
    prepare,
    registry,
)
from tests.core.chunks import batch
from tests.docs_blocks import docs_block


def test_the_documented_example_method_trains_as_written(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    exec(compile(docs_block("python", "# my_methods.py"), "my_methods.py", "exec"), {})
    yaml = tmp_path / "rms_advantage.yaml"
    yaml.write_text(docs_block("yaml", "# conf/method/rms_advantage.yaml"))
    with pytest.raises(ValueError, match=r"method\.rms_floor must be > 0"):
        load_method(yaml, ["rms_floor=0"])
    with pytest.raises(ValueError, match=r"unknown key method\.rms_flor"):
        load_method(yaml, ["rms_flor=1"])

    objective = build_objective(load_method(yaml))
    chunk = batch(n=120, seed=4)
    halves = [
        TokenChunk(chunk.logprob[s], chunk.entropy[s], chunk.advantages[s], chunk.mask[s])
        for s in (slice(0, 50), slice(50, 120))
    ]
    prepared = prepare(objective, halves, SingleProcessReducer())
    valid = chunk.mask
    a, lp = chunk.advantages.double()[valid], chunk.logprob.double()[valid]
    rms = float(a.square().mean().sqrt())
    assert prepared.metrics["advantage/rms"] == pytest.approx(rms, rel=1e-12)
    loss = sum(
        float(policy_loss(objective, c.logprob, c.advantages, c.mask, k, prepared.n_tokens).loss)
        for c, k in zip(halves, prepared.coefficients, strict=True)
    )
    # fp32 per-token products of both signs, summed over ~90 tokens in two halves: round-off
    # of n·u₃₂ of the terms Σ|A log π| (tests/metric_bounds.py)
    terms = float((a * lp).abs().sum() / rms / a.numel())
    assert loss == pytest.approx(float(-(a * lp).sum() / rms / a.numel()), rel=0, abs=1e-5 * terms)


def _chunk_with_entropy(seed: int, mean_entropy: float) -> TokenChunk:
    chunk = batch(n=80, seed=seed)
    entropy = torch.full_like(chunk.entropy, mean_entropy)
    return TokenChunk(chunk.logprob, entropy, chunk.advantages, chunk.mask)


def test_target_balance_takes_the_first_steps_entropy_and_a_resumed_run_keeps_it():
    config = method_config({"name": "opefo", "entropy_flow": {"balance": "target"}})
    run = build_objective(config)
    first = prepare(run, [_chunk_with_entropy(1, 0.9)], SingleProcessReducer())
    assert first.metrics["flow/target_entropy"] == pytest.approx(0.9)
    # at the target, the first step is adaptive OPEFO: λ applied = λ*
    assert first.metrics["flow/lambda_applied"] == pytest.approx(first.lambda_star, abs=1e-12)

    resumed = build_objective(config)
    resumed.load_state_dict(run.state_dict())
    fresh = build_objective(config)
    second = _chunk_with_entropy(2, 0.6)
    want = prepare(run, [second], SingleProcessReducer())
    got = prepare(resumed, [second], SingleProcessReducer())
    assert torch.equal(got.coefficients[0].weight, want.coefficients[0].weight)
    # below the target (0.6 < 0.9): λ = λ* + g (H_target − H), g = 1, the entropy is pushed up
    gap = want.metrics["flow/target_entropy"] - want.metrics["entropy/mean"]
    assert gap == pytest.approx(0.3, rel=1e-6)  # the entropies are fp32 copies of 0.9 and 0.6
    assert want.metrics["flow/lambda_applied"] == pytest.approx(
        min(want.lambda_star + gap, 1.0), abs=1e-12
    )
    assert want.metrics["flow/net_after_balance"] > 0
    restart = prepare(fresh, [second], SingleProcessReducer())  # no state: takes 0.6 as target
    assert restart.metrics["flow/target_entropy"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="checkpoint state"):
        fresh.load_state_dict({})


def test_entropy_reg_current_rule_closes_the_loop_within_its_bounds():
    config = method_config(
        {
            "name": "entropy_reg",
            "updates_per_rollout": 2,
            "entropy_coef": 0.01,
            "entropy_coef_target": 0.5,
            "entropy_coef_step": 0.004,
            "entropy_coef_min": 0.0,
            "entropy_coef_max": 0.02,
            "entropy_coef_rule": "current",
        }
    )
    objective = build_objective(config)
    expected, coef = [], 0.01
    for mean_entropy in (0.3, 0.3, 0.3, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.5):
        step = 0.004 * ((mean_entropy < 0.5) - (mean_entropy > 0.5))
        coef = min(max(coef + step, 0.0), 0.02)
        expected.append(coef)
        chunk = _chunk_with_entropy(3, mean_entropy)
        old = chunk.logprob + 0.1
        chunk = TokenChunk(chunk.logprob, chunk.entropy, chunk.advantages, chunk.mask, old)
        prepared = prepare(objective, [chunk], SingleProcessReducer())
        assert prepared.metrics["entropy_reg/coef"] == pytest.approx(coef, abs=1e-15)
        entropy = chunk.entropy.clone().requires_grad_()
        out = policy_loss(
            objective,
            chunk.logprob,
            chunk.advantages,
            chunk.mask,
            prepared.coefficients[0],
            prepared.n_tokens,
            old_logprob=old,
            entropy=entropy,
        )
        out.loss.backward()
        # ∂L/∂H_t = −β / N on every valid token: the loss uses the coefficient just stepped
        want = torch.where(chunk.mask, -coef / prepared.n_tokens, 0.0)
        torch.testing.assert_close(entropy.grad, want.float(), rtol=1e-6, atol=0.0)
    assert max(expected) == 0.02 and min(expected) == 0.0  # both bounds were reached
    resumed = build_objective(config)
    resumed.load_state_dict(objective.state_dict())
    assert resumed.coef == objective.coef and resumed.target == 0.5
    with pytest.raises(ValueError, match=r"checkpoint state has \['coef'\]"):
        build_objective(config).load_state_dict({"coef": 0.01})
    with pytest.raises(ValueError, match=r"'grpo_strict': checkpoint state has \['coef'\]"):
        build_objective(load_method("grpo_strict")).load_state_dict({"coef": 0.01})


def test_a_method_must_declare_the_loss_sums_it_returns(monkeypatch):
    from opefo_nemo.core.objectives.methods.grpo_strict import StrictPolicyGradient

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @registry.register_objective("undeclared_sums")
    class Undeclared(StrictPolicyGradient):
        def loss_sums(self, inputs, valid, delta_h):
            return {"extra": valid.sum().double()}

    objective = build_objective(method_config({"name": "undeclared_sums"}))
    chunk = batch(seed=6)
    prepared = prepare(objective, [chunk], SingleProcessReducer())
    with pytest.raises(ValueError, match=r"returned loss sums \['extra'\], declared \[\]"):
        policy_loss(
            objective, chunk.logprob, chunk.advantages, chunk.mask, prepared.coefficients[0], 10
        )
