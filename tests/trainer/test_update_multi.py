"""Approximate on-policy (k updates per rollout) on the hf engine, against a by-hand reference.

spec §5: mini-batch ``j`` is its own optimizer step with the clipped surrogate over its own
tokens, ``ρ = exp(logprob − logprob_old)`` where ``logprob_old`` is the *rollout* policy's (the
weights before the first update), not the weights of the previous mini-batch step.
"""

from __future__ import annotations

import copy

import torch

from opefo_nemo.config import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.trainer.update import update_rollout_batch
from tests.metric_bounds import assert_grads_close
from tests.trainer.update_inputs import (
    ENGINE,
    GRAD_REL,
    TEMPERATURE,
    random_rollout,
    response_logprobs,
)

ROWS, UPDATES, EPS, DUAL_C = 6, 2, 0.05, 3.0  # grpo's default dual clip c = 3


def reference_gradient(model, prompts, responses, adv, old) -> tuple[dict, float]:
    """``∇ Σ ℓ / N`` over the given rows with ``ℓ = max(−A ρ, −A clip(ρ, 1 ± ε))``, capped at
    ``−c A`` where ``A < 0`` (dual clip); also ``max |ρ − 1|``."""
    model = copy.deepcopy(model)
    new = torch.cat(response_logprobs(model, prompts, responses))
    a = torch.cat([torch.full((len(r),), float(x)) for r, x in zip(responses, adv, strict=True)])
    rho = torch.exp(new - torch.cat(old))
    terms = torch.maximum(-a * rho, -a * rho.clamp(1 - EPS, 1 + EPS))
    terms = torch.where(a < 0, torch.minimum(terms, -DUAL_C * a), terms)
    (terms.sum() / new.numel()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, float((rho.detach() - 1).abs().max())


def test_every_mini_batch_step_uses_the_rollout_policy_as_old(model_dir):
    overrides = [f"updates_per_rollout={UPDATES}", f"clip_eps_low={EPS}", f"clip_eps_high={EPS}"]
    method = load_method("grpo", overrides)
    policy = HFPolicy(model_dir, ENGINE, lr=1e-2, temperature=TEMPERATURE)
    prompts, responses, adv = random_rollout(ROWS, seed=3)
    with torch.no_grad():
        old = response_logprobs(policy.model, prompts, responses)

    size = ROWS // UPDATES
    references, taken = [], []
    train_step, step = policy.train_step, policy.optimizer.step

    def reference_then_train(micro_batches, loss_fn, sum_names, **layout):
        rows = slice(len(references) * size, (len(references) + 1) * size)
        references.append(
            reference_gradient(policy.model, prompts[rows], responses[rows], adv[rows], old[rows])
        )
        return train_step(micro_batches, loss_fn, sum_names, **layout)

    def capture_then_step(*args, **kwargs):
        taken.append({n: p.grad.clone() for n, p in policy.model.named_parameters()})
        return step(*args, **kwargs)

    policy.train_step = reference_then_train
    policy.optimizer.step = capture_then_step
    batch = build_batch(prompts, responses, adv, pad_id=0)
    outcome = update_rollout_batch(
        policy, build_objective(method), batch, micro_batch_size=2, seed=0
    )

    assert outcome.skipped_steps == 0 and len(taken) == len(references) == UPDATES
    assert references[0][1] < 1e-6  # the first step sees the rollout weights: ρ ≡ 1
    assert references[1][1] > 0.05  # the second one does not, so a wrong old would show
    for (want, _), got in zip(references, taken, strict=True):
        assert_grads_close(got, want, rel=GRAD_REL)
