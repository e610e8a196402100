"""Every ΔH estimator reaches phase 2 from the engine: the flows P and N of one update equal a
float64 brute force over the full softmax of each response token (spec §2, §3)."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.config import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.trainer.update import update_rollout_batch
from tests.trainer.update_inputs import ENGINE, TEMPERATURE, random_rollout


def brute_force_flows(model, prompts, responses, adv, estimator: str) -> tuple[float, float]:
    """``(P, N)`` with ΔH_t from the whole distribution π of each response token, in float64."""
    deltas = []
    for p, r, a in zip(prompts, responses, adv.tolist(), strict=True):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1]
        logpi = torch.log_softmax(logits.double() / TEMPERATURE, dim=-1)
        pi = logpi.exp()
        h = -(pi * logpi).sum(-1)
        lp = logpi.gather(1, torch.tensor(r)[:, None])[:, 0]
        p_t = lp.exp()
        if estimator == "paper":
            dh = -a * (1 - p_t) ** 2 * (lp + h)
        elif estimator == "tabular":
            dh = -a * (p_t * (lp + h) - ((pi**2 * logpi).sum(-1) + h * (pi**2).sum(-1)))
        else:  # the paper's integrand averaged over a ~ π
            dh = -a * (pi * (1 - pi) ** 2 * (logpi + h[:, None])).sum(-1)
        deltas.append(dh)
    delta = torch.cat(deltas)
    return float(delta.clamp(min=0).sum()), float((-delta).clamp(min=0).sum())


@pytest.mark.parametrize("estimator", ["paper", "tabular", "expectation"])
def test_the_flows_of_every_estimator_match_a_brute_force(model_dir, estimator):
    policy = HFPolicy(model_dir, ENGINE, lr=1e-3, temperature=TEMPERATURE)
    prompts, responses, adv = random_rollout(rows=8, seed=11)
    with torch.no_grad():
        pos, neg = brute_force_flows(policy.model, prompts, responses, adv, estimator)
    method = load_method("grpo_strict", [f"entropy_flow.estimator={estimator}"])
    batch = build_batch(prompts, responses, adv, 0)
    metrics = update_rollout_batch(policy, build_objective(method), batch, 3, seed=0).metrics
    # fp32 statistics against float64: relative error of a sum of same-signed terms ~1e-6
    assert metrics["flow/pos"] == pytest.approx(pos, rel=1e-4)
    assert metrics["flow/neg"] == pytest.approx(neg, rel=1e-4)
    if estimator == "expectation":  # ΔH has the sign of A: S+ are the positive-advantage tokens
        assert pos > 0 and neg > 0
