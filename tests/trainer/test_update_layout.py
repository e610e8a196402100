"""The update is the same whichever rows share a micro-batch (spec §11): for every registered
method, with one and (where the method allows) two optimizer steps per rollout batch, the
``balanced`` layout and ``balanced`` with a token budget against ``contiguous`` on the ``hf``
engine (for two strict methods also ``balanced`` with the statistics pass's graphs kept,
``engine.shared_forward``); and the ``perf/*`` metrics the update logs."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from opefo_nemo.config import load_method
from opefo_nemo.core.objectives import build_objective, objective_class, registered_objectives
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.batch_layout import concatenated, dp_imbalance, pad_fraction
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.trainer.update import update_rollout_batch
from opefo_nemo.trainer.update_layout import plan_update, row_lengths
from tests.metric_bounds import U32, assert_grads_close
from tests.trainer.update_inputs import ENGINE, GRAD_REL, TEMPERATURE, random_rollout

ROWS, MICRO, BUDGET, LR = 8, 3, 24, 1e-2
#: Selections that pick a good share of the 8 rows' tokens (the papers' ratios pick none here)
OVERRIDES = {
    "clip_cov": ["clip_cov.ratio=0.3", "clip_cov.lb=0.0", "clip_cov.ub=100.0"],
    "kl_cov": ["kl_cov.ratio=0.3"],
}
#: Strict methods also run with the statistics pass's graphs kept: a balanced one, a corrected one
SHARED = ("opefo", "entropy_neutral")
CASES = [
    (name, updates)
    for name in registered_objectives()
    for updates in (1, 2)
    if updates == 1 or not objective_class(name).strict
]
#: AdamW with ε = 1 moves each weight by lr·m̂/(√v̂ + 1), a 1-Lipschitz function of m̂ and √v̂
#: (|m̂| ≤ √v̂), each within max|δg| of the other run's: a gradient difference δg moves a weight
#: by at most 2·lr·max|δg| per step. With the default ε = 1e-8 it would be lr·δg/ε, and the
#: weights of near-zero gradients would be free to differ by lr.
LIPSCHITZ_ENGINE = dataclasses.replace(ENGINE, micro_batch_size=MICRO, adam_eps=1.0)


@dataclasses.dataclass
class Run:
    outcome: object
    lambdas: list[float]
    token_counts: list[int]
    selected: list[set[int]]
    grads: list[dict[str, torch.Tensor]]
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]


def run(model_dir, name, updates, layout, budget=None, shared=False) -> Run:
    """One update of the 8-row batch from the same weights, with what each optimizer step's
    ``prepare`` decided (λ*, token count, the global ids of the selected tokens) and the
    gradient the optimizer stepped with."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KL-Cov at one update: its penalty is zero
        method = load_method(name, [f"updates_per_rollout={updates}", *OVERRIDES.get(name, [])])
    engine = dataclasses.replace(LIPSCHITZ_ENGINE, shared_forward=shared)
    policy = HFPolicy(model_dir, engine, lr=LR, temperature=TEMPERATURE)
    objective = build_objective(method)
    record = Run(None, [], [], [], [], {}, {})
    coefficients = objective.coefficients

    def recorded(batch, reducer, seed):
        result = coefficients(batch, reducer, seed)
        record.lambdas.append(batch.lambda_star)
        record.token_counts.append(batch.n_tokens)
        ids = [c.token_ids[k.selected].tolist() for c, k in zip(batch.chunks, result, strict=True)]
        record.selected.append({i for part in ids for i in part})
        return result

    step = policy.optimizer.step

    def stepped(*args, **kwargs):
        record.grads.append({n: p.grad.clone() for n, p in policy.model.named_parameters()})
        return step(*args, **kwargs)

    objective.coefficients = recorded
    policy.optimizer.step = stepped
    record.before = {n: w.clone() for n, w in policy.named_weights()}
    batch = build_batch(*random_rollout(ROWS, seed=11), pad_id=0)
    record.outcome = update_rollout_batch(
        policy,
        objective,
        batch,
        MICRO,
        0,
        batch_layout=layout,
        max_tokens_per_micro_batch=budget,
    )
    record.after = {n: w.clone() for n, w in policy.named_weights()}
    return record


def weight_bound(reference: Run, name: str) -> float:
    """How far one weight tensor may end from the reference's: per optimizer step ``2·lr`` times
    the gradients' difference (``2·GRAD_REL`` of the tensor's largest gradient: both runs are
    within ``GRAD_REL`` of the exact one) and the rounding of the fp32 weight; for a corrected
    step also ``α g``'s difference: ``g`` within ``2·GRAD_REL``, and ``α = (c − ⟨g, Δθ⟩)/‖g‖²``
    within ``2·GRAD_REL`` of its terms ``‖Δθ‖/‖g‖ + |α|`` (tests/metric_bounds.py), so
    ``|δ(α g)| ≤ 2·GRAD_REL·(‖Δθ‖ + 2|α|‖g‖)`` with ``‖Δθ‖ ≤ ‖θ' − θ‖ + |α|‖g‖``."""
    bound = 0.0
    for grads in reference.grads:
        bound += 2 * LR * 2 * GRAD_REL * float(grads[name].abs().max())
        bound += 2 * U32 * float(reference.after[name].abs().max())
    moved = math.sqrt(
        sum(
            float((reference.after[n] - reference.before[n]).double().square().sum())
            for n in reference.after
        )
    )
    for c in reference.outcome.corrections:
        correction = abs(c.alpha) * c.grad_norm
        bound += 2 * GRAD_REL * (moved + 3 * correction)
    return bound


@pytest.mark.parametrize(("name", "updates"), CASES)
def test_every_layout_updates_like_the_contiguous_one(model_dir, name, updates):
    reference = run(model_dir, name, updates, "contiguous")
    layouts = {
        "balanced": run(model_dir, name, updates, "balanced"),
        "budget": run(model_dir, name, updates, "balanced", budget=BUDGET),
    }
    if name in SHARED:
        layouts["shared"] = run(model_dir, name, updates, "balanced", shared=True)
    assert reference.outcome.skipped_steps == 0 and len(reference.grads) == updates
    if name in OVERRIDES:
        assert all(reference.selected), reference.selected  # every step selects tokens
    for label, got in layouts.items():
        where = f"{name} × {updates}, {label}"
        assert got.outcome.skipped_steps == 0, where
        assert got.token_counts == reference.token_counts, where
        assert got.selected == reference.selected, where
        for ours, theirs in zip(got.lambdas, reference.lambdas, strict=True):
            assert abs(ours - theirs) <= 2 * GRAD_REL, where  # λ* has scale 1
        assert len(got.grads) == updates, where
        for ours, theirs in zip(got.grads, reference.grads, strict=True):
            assert_grads_close(ours, theirs, rel=2 * GRAD_REL)
        for weight, want in reference.after.items():
            error = float((got.after[weight] - want).abs().max())
            bound = weight_bound(reference, weight)
            assert error <= bound, (
                f"{where}: {weight} moved {error:.3g} from contiguous > {bound:.3g}"
            )


def test_the_layouts_under_test_regroup_the_rows(model_dir):
    """Not vacuous: the balanced layouts (and the budget's) group the test batch's rows
    otherwise than the contiguous one, with less padding."""
    policy = HFPolicy(model_dir, LIPSCHITZ_ENGINE, lr=LR, temperature=TEMPERATURE)
    batch = build_batch(*random_rollout(ROWS, seed=11), pad_id=0)
    for updates in (1, 2):
        contiguous = plan_update(policy, batch, updates, MICRO, "contiguous")
        balanced = plan_update(policy, batch, updates, MICRO)
        budget = plan_update(policy, batch, updates, MICRO, max_tokens_per_micro_batch=BUDGET)
        assert [p.rows for p in balanced] != [p.rows for p in contiguous]
        assert [p.rows for p in budget] != [p.rows for p in balanced]
        lengths = row_lengths(batch)
        assert pad_fraction(balanced, lengths) < pad_fraction(contiguous, lengths)


def test_the_update_logs_the_layouts_padding_imbalance_and_micro_batches(model_dir):
    """``perf/*`` of an update with two mini-batches are those of its passes: the statistics
    pass over the batch, mini-batch 1's own, and the two optimizer steps (spec §11), with the
    attention width the update is given (the model's, from the trainer)."""
    batch = build_batch(*random_rollout(ROWS, seed=11), pad_id=0)
    policy = HFPolicy(model_dir, LIPSCHITZ_ENGINE, lr=LR, temperature=TEMPERATURE)
    attention = 30
    layouts = plan_update(policy, batch, 2, MICRO, attention_width=attention)
    objective = build_objective(load_method("grpo", ["updates_per_rollout=2"]))
    metrics = update_rollout_batch(
        policy, objective, batch, MICRO, 0, attention_width=attention
    ).metrics
    passes = [concatenated(layouts), layouts[1], *layouts]
    lengths = row_lengths(batch)
    assert metrics["perf/pad_fraction"] == pad_fraction(passes, lengths, 1, attention)
    assert metrics["perf/pad_fraction"] != pad_fraction(passes, lengths)  # attention counted
    assert metrics["perf/dp_imbalance"] == dp_imbalance(passes, lengths, 1, attention) == 1.0
    assert metrics["perf/micro_batches"] == len(layouts[0].rows) + len(layouts[1].rows)
