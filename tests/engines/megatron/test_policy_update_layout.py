"""The trainer's update on ``engine=megatron`` is the same whichever rows share a micro-batch and
whichever rank runs it (spec §11): for every registered method, with one and (where the method
allows) two optimizer steps per rollout batch, ``engine.batch_layout=balanced`` and ``balanced``
with a token budget (micro-batches of as many rows as fit 32 padded tokens, so the ranks run
different numbers of them) against ``contiguous``.

``update_rollout_batch`` runs on ``MegatronPolicy`` built by ``engine=megatron``'s own builder
(fp32, megatron's DDP and optimizer, distributed optimizer off so the reduced gradients can be
read; no clipping; AdamW ε = 1) on gloo CPU ranks, one spawned world per parallel layout with
every method inside: DP 2 × TP 2 with sequence parallelism (4 ranks) and PP 2 (2 ranks).
Identical: each optimizer step's token count and selected token ids (Clip-Cov, KL-Cov, STEER);
equal up to fp32 round-off: λ*, every metric but ``perf/*`` (which describe the layout) and the
entropy correction's ``flow_after`` (the target up to rounding, in every layout), each step's
gradient; the weights after the update within what AdamW with ε = 1 and the entropy correction
make of those gradients (:func:`weight_bound`).
"""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.core.objectives import objective_class, registered_objectives
from tests.metric_bounds import U32, assert_grads_close, assert_metrics_close
from tests.parallel.world import run_world

from . import workers_policy_update_layout
from .hf_reference import TP2_SP, save_hf_model
from .tiny import random_batch

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

#: Lengths 4, 10, 17, 7, 5, 19, 5, 16 tokens (prompt + response): the balanced layouts regroup
#: every mini-batch, and under the token budget the ranks of DP 2 run 3 and 2 micro-batches
#: (one step) or 2 and 1 (the first of two) (:func:`test_the_layouts_under_test_regroup_the_rows`).
BATCH = {"rows": 8, "vocab": 100, "seed": 50, "low": 1, "longest_response": 16}
#: No clipping, no warm-up, AdamW ε = 1: each step moves a weight by lr·m̂/(√v̂ + 1), which
#: moves by at most 2·max|δg| when the gradients so far move by δg (|m̂| ≤ √v̂).
ENGINE = {"grad_clip": 0.0, "warmup_steps": 0, "adam_eps": 1.0, "use_distributed_optimizer": False}
WORLDS = {
    "dp2-tp2-sp": (4, {**ENGINE, **TP2_SP}),
    "pp2": (2, {**ENGINE, "pipeline_model_parallel_size": 2}),
}
CASES = [
    (name, updates)
    for name in registered_objectives()
    for updates in (1, 2)
    if updates == 1 or not objective_class(name).strict
]
#: fp32 round-off of rows run in batches of other shapes and gradients accumulated in another
#: order, relative to each gradient tensor's largest magnitude and to each metric's terms
#: (tests/metric_bounds.py): at most 1.7e-5 (gradients) and 8.9e-6 (metrics) seen, in the
#: second of two steps (the first step's differences carried into its weights and ratios).
REL = 1e-4
#: λ* (scale 1): at most 2e-7 seen.
LAMBDA_REL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{world: [record of each case]}``."""
    hf_dir = tmp_path_factory.mktemp("qwen2")
    save_hf_model("qwen2", hf_dir)
    out = {}
    for label, (size, engine) in WORLDS.items():
        folder = tmp_path_factory.mktemp(label)
        batch = random_batch(**BATCH)
        run_world(
            workers_policy_update_layout.layout_updates,
            size,
            str(hf_dir),
            engine,
            CASES,
            batch,
            str(folder),
            deadline_s=1200.0,
        )
        out[label] = [torch.load(folder / f"case_{i}.pt") for i in range(len(CASES))]
    return out


def weight_bound(want: dict, got: dict, name: str, gap: float) -> float:
    """How far weight ``name`` may end from the contiguous run's: per optimizer step ``s``,
    ``2·lr·max_{t≤s} max|g_t − g′_t|`` (AdamW with ε = 1, the module docstring) and the fp32
    rounding of each side's update (a few operations, ``8u₃₂·lr``) and of the weight it is added
    to (``2u₃₂|θ|``); per entropy correction, ``gap`` (the largest difference of the applied
    ``α g``, measured over every rank) and its rounding."""
    lr, moved, bound = workers_policy_update_layout.LR, 0.0, 0.0
    scale = float(want["weights"][name].abs().max())
    for ours, theirs in zip(got["grads"], want["grads"], strict=True):
        moved = max(moved, float((ours[name] - theirs[name]).abs().max()))
        bound += 2 * lr * moved + 8 * U32 * lr + 2 * U32 * scale
    return bound + want["corrections"] * (gap + U32 * scale)


def _layout_free(metrics: dict) -> dict:
    """The metrics but ``correction/flow_after`` (``⟨g, Δθ'⟩``, the target up to the corrected
    weights' rounding: :func:`_assert_flow_after_rounded`); ``assert_metrics_close`` compares
    ``perf/*``, which describe the layout, by name only."""
    return {k: v for k, v in metrics.items() if k != "correction/flow_after"}


def _assert_flow_after_rounded(record: dict) -> None:
    """``⟨g, Δθ'⟩`` measured on the fp32 weights is the correction's target up to the rounding of
    each corrected weight: ``Σ|g_i|·2u₃₂|θ_i| ≤ ‖g‖·2u₃₂‖θ‖``."""
    metrics = record["metrics"]
    norm = math.sqrt(sum(float(w.double().square().sum()) for w in record["weights"].values()))
    bound = metrics["correction/entropy_grad_norm"] * 2 * U32 * norm
    assert abs(metrics["correction/flow_after"] - metrics["correction/target"]) <= bound


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize(
    ("index", "case"), list(enumerate(CASES)), ids=[f"{n}-x{u}" for n, u in CASES]
)
def test_every_layout_updates_like_the_contiguous_one(runs, world, index, case):
    name, updates = case
    result = runs[world][index]
    want = result["contiguous"]
    assert want["skipped"] == 0 and len(want["grads"]) == updates
    if name in workers_policy_update_layout.OVERRIDES:
        assert all(want["selected"]), want["selected"]  # every step selects tokens
    for label in ("balanced", "budget"):
        got, where = result[label], f"{name} × {updates}, {label}"
        assert got["skipped"] == 0, where
        assert got["token_counts"] == want["token_counts"], where
        assert got["selected"] == want["selected"], where
        for ours, theirs in zip(got["lambdas"], want["lambdas"], strict=True):
            assert abs(ours - theirs) <= LAMBDA_REL, where  # λ* has scale 1
        assert_metrics_close(_layout_free(got["metrics"]), _layout_free(want["metrics"]), rel=REL)
        if want["corrections"]:
            _assert_flow_after_rounded(got)
        assert len(got["grads"]) == updates, where
        for step_got, step_want in zip(got["grads"], want["grads"], strict=True):
            assert_grads_close(step_got, step_want, rel=REL)
        gap = result["correction_gap"][label]
        for weight, value in want["weights"].items():
            error = float((got["weights"][weight] - value).abs().max())
            bound = weight_bound(want, got, weight, gap)
            assert error <= bound, f"{where}: {weight} moved {error:.3g} > {bound:.3g}"


@pytest.mark.parametrize("world", list(WORLDS))
def test_the_layouts_under_test_regroup_the_rows(runs, world):
    """Not vacuous: the balanced layouts group the rows otherwise than the contiguous one, and
    under the token budget the data-parallel ranks run different numbers of micro-batches (at
    DP 2) and the micro-batches differ in rows and width."""
    for result in runs[world]:
        plans = {label: result[label]["layouts"] for label in ("contiguous", "balanced", "budget")}
        for (balanced, _), (contiguous, _) in zip(
            plans["balanced"], plans["contiguous"], strict=True
        ):
            assert set(balanced) != set(contiguous)
        assert any(len({len(r) for r in rows}) > 1 for rows, _ in plans["budget"])
        if world.startswith("dp2"):
            assert any(owners.count(0) != owners.count(1) for _, owners in plans["budget"])
