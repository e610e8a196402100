"""Rank function of ``test_policy_update_layout.py``: the trainer's ``update_rollout_batch`` on
``MegatronPolicy`` (``engine=megatron``'s own builder, ``engine.device=cpu``, gloo ranks spawned by
``tests.parallel.world``) for every method under several batch layouts, with what each
optimizer step's ``prepare`` decided and the gradients it stepped with."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.trainer.update import update_rollout_batch
from opefo_nemo.trainer.update_layout import plan_update

from .optimizer_capture import main_grads_at_steps
from .tiny import release_parallel_state
from .workers_policy import hf_names

TEMPERATURE = 0.7
LR = 1e-2
MICRO = 2
#: Selections that pick a good share of the 8 rows' tokens (the papers' ratios pick none here).
OVERRIDES = {
    "clip_cov": ["clip_cov.ratio=0.3", "clip_cov.lb=0.0", "clip_cov.ub=100.0"],
    "kl_cov": ["kl_cov.ratio=0.3"],
}
#: ``(engine.batch_layout, engine.max_tokens_per_micro_batch)`` of each layout compared.
LAYOUTS = {
    "contiguous": ("contiguous", None),
    "balanced": ("balanced", None),
    "budget": ("balanced", 32),
}


def layout_updates(
    rank: int, world_size: int, hf_dir: str, engine: dict, cases: list, batch, out_dir: str
) -> None:
    """For each ``(method, updates_per_rollout)`` of ``cases`` and each of :data:`LAYOUTS`, a
    fresh policy (``engine``: MegatronEngineConfig keys) and one update of ``batch``
    (:func:`_update`); then the largest difference of the applied entropy corrections ``α g``
    from the contiguous layout's over every rank's tensors. Rank 0 saves ``{layout: record,
    "correction_gap": {layout: float}}`` as ``out_dir/case_<i>.pt``."""
    warnings.filterwarnings("ignore")
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    config = MegatronEngineConfig(
        device="cpu",
        dtype="float32",
        transformer_engine=False,
        make_vocab_size_divisible_by=8,
        micro_batch_size=MICRO,
        **engine,
    )
    try:
        for index, (name, updates) in enumerate(cases):
            records, corrections = {}, {}
            for label, (layout, budget) in LAYOUTS.items():
                policy = build_megatron_policy(hf_dir, config, lr=LR, temperature=TEMPERATURE)
                records[label], corrections[label] = _update(
                    policy, name, updates, batch, layout, budget
                )
            gaps = {
                label: _largest_gap(corrections["contiguous"], c)
                for label, c in corrections.items()
            }
            if rank == 0:
                torch.save({**records, "correction_gap": gaps}, Path(out_dir) / f"case_{index}.pt")
    finally:
        release_parallel_state()


def _update(policy, name: str, updates: int, batch, layout: str, budget: int | None):
    """One ``update_rollout_batch`` of ``batch``; returns rank 0's record (the metrics, skipped
    steps, each step's λ*, token count and selected token ids, its gradient in Hugging Face
    names, the weights after, the planned layouts) and this rank's applied corrections
    ``α g`` (one list of tensors per corrected step)."""
    method = load_method(name, [f"updates_per_rollout={updates}", *OVERRIDES.get(name, [])])
    objective = build_objective(method)
    decided: dict[str, list] = {"lambdas": [], "token_counts": [], "selected": []}
    coefficients = objective.coefficients

    def recorded(prepared, reducer, seed):
        result = coefficients(prepared, reducer, seed)
        decided["lambdas"].append(prepared.lambda_star)
        decided["token_counts"].append(prepared.n_tokens)
        chunks = zip(prepared.chunks, result, strict=True)
        decided["selected"].append({i for c, k in chunks for i in c.token_ids[k.selected].tolist()})
        return result

    objective.coefficients = recorded
    corrections: list[list[torch.Tensor]] = []
    capture = policy.capture_entropy_gradient

    def captured(*args, **kwargs):
        gradient = capture(*args, **kwargs)
        move = gradient.move

        def moved(alpha: float) -> None:
            corrections.append([alpha * g for g in gradient.grads])
            move(alpha)

        gradient.move = moved
        return gradient

    policy.capture_entropy_gradient = captured
    plans = plan_update(policy, batch, updates, MICRO, layout, budget)
    with main_grads_at_steps(policy) as steps:
        outcome = update_rollout_batch(
            policy,
            objective,
            batch,
            MICRO,
            0,
            batch_layout=layout,
            max_tokens_per_micro_batch=budget,
        )
    record = {
        "metrics": outcome.metrics,
        "skipped": outcome.skipped_steps,
        "corrections": len(outcome.corrections),
        **decided,
        "grads": [hf_names(policy.layout, grads) for grads, _ in steps],
        "weights": {n: w.clone() for n, w in policy.named_weights()},
        "layouts": [(plan.rows, plan.owners) for plan in plans],
    }
    return record, corrections


def _largest_gap(want: list[list[torch.Tensor]], got: list[list[torch.Tensor]]) -> float:
    """``max |α g − α′ g′|`` over every element of every rank's optimizer tensors (0 without
    corrections); one MAX all-reduce over the world."""
    gap = torch.zeros(1, dtype=torch.float64)
    for ours, theirs in zip(got, want, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            gap = torch.maximum(gap, (a.double() - b.double()).abs().max().reshape(1))
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return float(gap[0])
