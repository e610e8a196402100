"""The loop end to end with the real vLLM CPU rollout engine and the warm-started tiny model."""

from __future__ import annotations

import json
import math

import pytest

from opefo_nemo.config import method_names
from opefo_nemo.trainer.metrics_log import read_metrics
from tests.metric_bounds import U32, assert_metrics_close, balanced_flow_bound, term_scale

pytestmark = pytest.mark.vllm

SPEC6 = (
    "entropy/mean",
    "flow/pos",
    "flow/neg",
    "flow/net",
    "flow/lambda",
    "flow/frac_pos",
    "flow/net_after_balance",
    "fidelity/abs_logprob_diff",
    "fidelity/kl",
    "fidelity/mult_prob_error",
    "fidelity/frac_beyond",
    "reward/mean",
    "response/length_mean",
    "response/clip_frac",
    "grad/norm",
    "lr",
    "time/rollout_s",
    "time/update_s",
    "time/step_s",
    "perf/pad_fraction",
    "perf/dp_imbalance",
    "perf/micro_batches",
)
CLIPPED = ("grpo", "clip_higher", "entropy_reg", "clip_cov", "steer")
CLIP_METRICS = (
    "clip/frac_upper",
    "clip/frac_lower",
    "clip/dh_upper",
    "clip/dh_lower",
    "clip/frac_dual",
)


@pytest.mark.parametrize("method", method_names())
def test_every_method_runs_two_steps_and_logs_its_metrics(make_trainer, tmp_path, method):
    trainer = make_trainer([f"method={method}", "metrics.realized_every=2"], tmp_path / method)
    assert trainer.run() == "done"
    records = read_metrics(tmp_path / method / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        expected = SPEC6 + (CLIP_METRICS if method in CLIPPED else ())
        for key in expected:
            assert isinstance(record[key], float) and math.isfinite(record[key]), (method, key)
        if method not in CLIPPED:
            assert not [key for key in record if key.startswith("clip/")], method
        # vLLM (fp32, its own CPU kernels) and the trainer score the same tokens of the same
        # weights: they agree far below the default 0.2-nat threshold
        assert record["fidelity/abs_logprob_diff"] < 1e-3 and record["fidelity/frac_beyond"] == 0
        assert 0 <= record["reward/mean"] <= 1
        assert -1 <= record["flow/lambda"] <= 1
        assert record["train/skipped_updates"] == 0
        if method == "steer":
            assert 0.8 <= record["steer/weight_mean"] <= 1.2
        if method == "opefo":
            assert abs(record["flow/net_after_balance"]) <= balanced_flow_bound(record)
        unweighted = ("grpo_strict", "grpo", "clip_higher", "entropy_reg", "clip_cov", "kl_cov")
        if method in (*unweighted, "entropy_neutral"):
            # weights 1: Σ ΔH against P − N, float64 sums in two orders (n·u₆₄ ≤ u₃₂ of P + N)
            bound = U32 * term_scale("flow/net", record)
            assert abs(record["flow/net_after_balance"] - record["flow/net"]) <= bound
        if method in ("correct_only", "incorrect_only"):
            # weight 1 on one sign of A, 0 on the other: Σ ΔH of the kept side (spec §6 split)
            side = "adv_pos" if method == "correct_only" else "adv_neg"
            kept = record[f"flow/pos_{side}"] - record[f"flow/neg_{side}"]
            bound = U32 * term_scale("flow/net", record)
            assert abs(record["flow/net_after_balance"] - kept) <= bound
        corrections = {key for key in record if key.startswith("correction/")}
        if method == "entropy_neutral":  # spec §6
            assert corrections == {
                "correction/target",
                "correction/flow_before",
                "correction/flow_after",
                "correction/alpha",
                "correction/entropy_grad_norm",
                "correction/norm",
            }
            assert record["correction/target"] == 0.0
        else:
            assert not corrections, method
    assert "flow/realized" in records[1] and "flow/realized" not in records[0]
    assert (tmp_path / method / "checkpoints" / "step_000002" / "trainer_state.json").is_file()


def _comparable(record):
    return {k: v for k, v in record.items() if not k.startswith("time/")}


@pytest.mark.parametrize(
    "method",
    [
        ["method=opefo"],
        # the correction's target keeps the first step's entropy: objective state in the checkpoint
        ["method=entropy_neutral", "method.entropy_flow.balance=target"],
    ],
    ids=["opefo", "entropy_neutral-target"],
)
def test_resume_equals_an_uninterrupted_run(make_trainer, tmp_path, method):
    common = [*method, "trainer.max_steps=3", "checkpoint.every=2", "method.lr=1e-3"]
    straight = make_trainer(common, tmp_path / "straight")
    assert straight.run() == "done"
    expected = read_metrics(tmp_path / "straight" / "metrics.jsonl")

    checkpoint = tmp_path / "straight" / "checkpoints" / "step_000002"
    resumed = make_trainer([*common, f"checkpoint.resume={checkpoint}"], tmp_path / "resumed")
    assert resumed.step == 2
    assert resumed.run() == "done"
    (step3,) = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert step3["step"] == 3
    got, want = _comparable(step3), _comparable(expected[2])
    assert_metrics_close(got, want, rel=1e-5)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["sampler"]["position"] == 8


def test_drift_follows_the_realized_step_and_validation_starts_at_the_warm_start(
    make_trainer, tmp_path
):
    """``flow/drift`` (spec §6) appears exactly at the step after each one that measured
    ``flow/realized`` and closes the sampled entropy's change with it; validation is logged at
    step 0 (the warm start's: what a trainer that has not trained validates) and every 2 steps."""
    settings = [
        "trainer.max_steps=4",
        "method.lr=1e-3",
        "metrics.realized_every=2",
        "validation.every=2",
        "validation.k=4",
        "validation.max_problems=8",
    ]
    trainer = make_trainer(settings, tmp_path / "run")
    assert trainer.run() == "done"
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert ["flow/realized" in r for r in records] == [False, False, True, False, True]
    assert ["flow/drift" in r for r in records] == [False, False, False, True, False]
    assert ["val/pass@4" in r for r in records] == [True, False, True, False, True]
    before, after = records[2], records[3]
    change = after["entropy/mean"] - before["entropy/mean"]
    # entropy/mean and the drift's entropies are the same float64 sums of fp32 token entropies,
    # divided in another order: u₃₂ of the terms bounds their difference
    bound = U32 * term_scale("flow/drift", after)
    assert abs(after["flow/drift"] - (change - before["flow/realized"])) <= bound
    assert after["flow/drift"] != 0.0 and before["flow/realized"] != 0.0

    fresh = make_trainer([*settings, "trainer.max_steps=0"], tmp_path / "fresh")
    assert fresh.validate() == {k: v for k, v in records[0].items() if k != "step"}
