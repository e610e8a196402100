"""On-policy fidelity on the hf engine: the rollout engine is played by a deliberately perturbed
copy of the policy; metrics and the truncated importance-sampling gradient against brute force."""

from __future__ import annotations

import copy

import pytest
import torch

from opefo_nemo.config import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.trainer.update import update_rollout_batch
from tests.metric_bounds import assert_grads_close
from tests.trainer.update_inputs import ENGINE, GRAD_REL, TEMPERATURE, random_rollout
from tests.trainer.update_inputs import response_logprobs as logprobs

CAP, THRESHOLD = 1.05, 0.03
#: fp32 logprobs of two reduction orders: within this of the largest |logprob| compared
LOGPROB_REL = 1e-5


@pytest.fixture(scope="module")
def rollout(model_dir):
    """A rollout batch and the perturbed "rollout engine"'s logprobs of its tokens."""
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    perturbed = copy.deepcopy(policy.model)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in perturbed.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.002)
        prompts, responses, adv = random_rollout(rows=8, seed=5)
        sampled = [lp.tolist() for lp in logprobs(perturbed, prompts, responses)]
    return prompts, responses, adv, sampled


def test_fidelity_metrics_of_a_perturbed_rollout_engine(model_dir, rollout):
    prompts, responses, adv, sampled = rollout
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    with torch.no_grad():
        reference_logprob = torch.cat(logprobs(policy.model, prompts, responses))
    rollout_logprob = torch.tensor([x for row in sampled for x in row], dtype=torch.float64)
    delta = reference_logprob - rollout_logprob
    batch = build_batch(prompts, responses, adv, 0, sampled)
    objective = build_objective(load_method("grpo_strict"))
    metrics = update_rollout_batch(
        policy, objective, batch, 3, seed=0, fidelity_threshold=THRESHOLD
    ).metrics
    assert 0.2 < float((delta.abs() > THRESHOLD).double().mean()) < 0.8  # the test can tell
    # the engine's logprobs are fp32: each within LOGPROB_REL of the largest |log p| of the
    # reference's, and so is every mean of their differences (|e^Δ − 1| ≤ 2|Δ| here)
    bound = LOGPROB_REL * float(reference_logprob.abs().max())
    want = float(delta.abs().mean())
    assert metrics["fidelity/abs_logprob_diff"] == pytest.approx(want, rel=0, abs=bound)
    want = float((delta.expm1() - delta).mean())
    assert metrics["fidelity/kl"] == pytest.approx(want, rel=0, abs=bound)
    want = float(delta.abs().exp().mean())
    assert metrics["fidelity/mult_prob_error"] == pytest.approx(want, rel=0, abs=2 * bound)
    near = (delta.abs() - THRESHOLD).abs() < bound  # tokens the fp32 round-off could flip
    beyond = (delta.abs() > THRESHOLD).double()
    assert abs(metrics["fidelity/frac_beyond"] - float(beyond.mean())) <= float(
        near.double().mean()
    )


def test_truncated_is_weight_scales_the_strict_gradient(model_dir, rollout):
    prompts, responses, adv, sampled = rollout
    reference = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    logp = torch.cat(logprobs(reference.model, prompts, responses))
    rollout_lp = torch.tensor([x for row in sampled for x in row], dtype=torch.float64)
    a = torch.cat([torch.full((len(r),), float(x)) for r, x in zip(responses, adv, strict=True)])
    weight = (logp.detach() - rollout_lp).exp().clamp(max=CAP)
    assert 0 < float((weight == CAP).double().mean()) < 1  # some tokens are capped, not all
    (-(weight * a.double() * logp).sum() / logp.numel()).backward()
    want = {n: p.grad for n, p in reference.model.named_parameters()}

    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    got = {}
    for name, param in policy.model.named_parameters():
        param.register_post_accumulate_grad_hook(
            lambda p, name=name: got.__setitem__(name, p.grad.detach().clone())
        )
    method = load_method("grpo_strict", [f"rollout_is_cap={CAP}"])
    batch = build_batch(prompts, responses, adv, 0, sampled)
    update_rollout_batch(policy, build_objective(method), batch, 3, seed=0)
    assert_grads_close(got, want, rel=GRAD_REL)


def test_the_correction_needs_the_rollout_logprobs(model_dir):
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    prompts, responses, adv = random_rollout()
    method = load_method("opefo", ["rollout_is_cap=2.0"])
    with pytest.raises(ValueError, match="rollout_is_cap needs the rollout engine's logprobs"):
        update_rollout_batch(
            policy, build_objective(method), build_batch(prompts, responses, adv, 0), 3, 0
        )
    with pytest.raises(ValueError, match=r"method\.rollout_is_cap must be >= 1"):
        load_method("opefo", ["rollout_is_cap=0.5"])
    with pytest.raises(ValueError, match=r"unknown key method\.rollout_is_cap"):
        load_method("grpo", ["rollout_is_cap=2.0"])
