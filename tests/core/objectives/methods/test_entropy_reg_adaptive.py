"""``entropy_reg``'s ``skywork`` rule equals TRL's adaptive entropy control step for step.

The reference is an independent re-implementation of the controller of TRL's ``GRPOTrainer`` with
``use_adaptive_entropy`` (Skywork-OR1's adaptive entropy control), on TRL's conventions: the
coefficient starts at ``entropy_coef`` and the last measured entropy at ``+inf``; every
micro-batch of an optimizer step applies ``coef`` if the last measured entropy is ``<=
entropy_target``, else 0; at the step's end the token-mean entropy over all of the step's
micro-batches (the "world" entropy) moves ``coef`` to ``min(coef + delta, max)`` if it is ``<=
entropy_target``, else to ``max(coef − delta, min)``, and becomes the last measured entropy.
"""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import TokenChunk, build_objective, method_config, policy_loss
from opefo_nemo.core.objectives import prepare as prepare_step

SETTINGS = {
    "entropy_coef": 0.01,
    "entropy_coef_target": 0.5,
    "entropy_coef_step": 0.004,
    "entropy_coef_min": 0.0,
    "entropy_coef_max": 0.02,
}


class TrlAdaptiveEntropy:
    """TRL's controller (module docstring)."""

    def __init__(self, coef: float, delta: float, low: float, high: float, target: float):
        self.coef, self.delta, self.low, self.high, self.target = coef, delta, low, high, target
        self.last_world_entropy = math.inf

    def optimizer_step(self, micro_batches: list[list[float]]) -> list[float]:
        """The coefficient each micro-batch's loss applies; ``micro_batches``: the entropies of
        each micro-batch's valid tokens."""
        applied = []
        window_sum, window_count = 0.0, 0
        for entropies in micro_batches:
            applied.append(self.coef if self.last_world_entropy <= self.target else 0.0)
            window_sum += math.fsum(entropies)
            window_count += len(entropies)
        world = window_sum / max(window_count, 1)
        if world <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_world_entropy = world
        return applied


def step_chunks(level: float, seed: int) -> list[TokenChunk]:
    """Two micro-batches whose valid tokens' entropies are multiples of 1/16 around ``level``
    (exact in float64 sums, so the ``<=`` comparisons see exact means); ``level`` exactly for
    seeds < 0."""
    g = torch.Generator().manual_seed(abs(seed))
    chunks = []
    for part in range(2):
        n = 24 + 8 * part
        spread = torch.randint(-3, 4, (n,), generator=g).float() / 16
        entropy = torch.full((n,), level) if seed < 0 else (level + spread).clamp(min=0.0)
        logprob = -torch.rand(n, generator=g) * 3
        chunks.append(
            TokenChunk(
                logprob=logprob,
                entropy=entropy,
                advantages=torch.randn(n, generator=g),
                mask=torch.rand(n, generator=g) > 0.25,
                old_logprob=logprob + torch.randn(n, generator=g) * 0.1,
            )
        )
    return chunks


#: per-step entropy levels: above the target, exactly at it (``<=``: the coefficient rises),
#: below it until the upper bound, above it until the lower bound, and back
LEVELS = [0.75, 0.5, 0.25, 0.25, 0.375, 0.25, 0.875, 0.75, 0.625, 0.75, 0.75, 0.5, 0.25, 0.6875]


def test_skywork_rule_equals_trls_adaptive_entropy_control():
    config = method_config({"name": "entropy_reg", "updates_per_rollout": 2, **SETTINGS})
    assert config.entropy_coef_rule == "skywork"  # the default
    objective = build_objective(config)
    trl = TrlAdaptiveEntropy(0.01, 0.004, 0.0, 0.02, 0.5)
    applied_seen, resumed = [], None
    for step, level in enumerate(LEVELS):
        chunks = step_chunks(level, seed=-1 if level == 0.5 else step)
        valid = [c.entropy[c.mask].double().tolist() for c in chunks]
        want = trl.optimizer_step(valid)
        assert want[0] == want[1]  # one coefficient for the whole optimizer step
        prepared = prepare_step(objective, chunks, SingleProcessReducer())
        assert prepared.metrics["entropy_reg/coef"] == want[0], step
        assert prepared.metrics["entropy_reg/controller"] == trl.coef, step
        applied_seen.append(want[0])
        for chunk, coefficients in zip(chunks, prepared.coefficients, strict=True):
            entropy = chunk.entropy.clone().requires_grad_()
            policy_loss(
                objective,
                chunk.logprob,
                chunk.advantages,
                chunk.mask,
                coefficients,
                prepared.n_tokens,
                old_logprob=chunk.old_logprob,
                entropy=entropy,
            ).loss.backward()
            # ∂L/∂H_t = −β / N on every valid token: the loss uses the gated coefficient
            expected = torch.where(chunk.mask, -want[0] / prepared.n_tokens, 0.0)
            torch.testing.assert_close(entropy.grad, expected.float(), rtol=1e-6, atol=0.0)
        if step == 6:
            resumed = build_objective(config)
            resumed.load_state_dict(objective.state_dict())
    assert applied_seen[0] == 0.0  # no measurement before the first step: no bonus
    assert 0.02 in applied_seen and 0.0 in applied_seen[1:]  # both bounds, and the gate, bite
    assert resumed is not None and resumed.state_dict() != objective.state_dict()
    for step in range(7, len(LEVELS)):  # a run resumed after step 6 takes the same coefficients
        chunks = step_chunks(LEVELS[step], seed=-1 if LEVELS[step] == 0.5 else step)
        prepared = prepare_step(resumed, chunks, SingleProcessReducer())
        assert prepared.metrics["entropy_reg/coef"] == applied_seen[step]
    assert resumed.state_dict() == objective.state_dict()


def test_a_current_rule_checkpoint_loads_under_skywork_with_its_gate_shut():
    skywork = build_objective(method_config({"name": "entropy_reg", **SETTINGS}))
    skywork.load_state_dict({"coef": 0.016, "target": 0.5})
    below = step_chunks(0.25, seed=3)
    prepared = prepare_step(skywork, below, SingleProcessReducer())
    assert prepared.metrics["entropy_reg/coef"] == 0.0  # no previous entropy: gate shut
    assert prepared.metrics["entropy_reg/controller"] == 0.016 + 0.004
    assert prepare_step(skywork, below, SingleProcessReducer()).metrics["entropy_reg/coef"] == 0.02
    with pytest.raises(ValueError, match=r"checkpoint state has \['coef'\]"):
        skywork.load_state_dict({"coef": 0.01})
    with pytest.raises(ValueError, match=r"method\.entropy_coef_rule is 'trl'"):
        method_config({"name": "entropy_reg", **SETTINGS, "entropy_coef_rule": "trl"})
