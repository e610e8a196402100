"""``opefo-probe``'s figures are those ``opefo-train`` logs at step 1 on the same batch, for every
ΔH estimator (the trainer run once per estimator from the same start), and the command's table,
verdict and JSON; with the real vLLM CPU rollout engine and the warm-started tiny model."""

from __future__ import annotations

import json
import re

import pytest

from opefo_nemo.cli.probe import main
from opefo_nemo.core.entropy_flow import ESTIMATORS
from opefo_nemo.probe.step import probe
from tests.metric_bounds import assert_metrics_close
from tests.trainer.small_run import run_overrides

pytestmark = pytest.mark.vllm
#: The probe's token-stats pass asks for every estimator's vocabulary sums, the trainer's only
#: for its own; the sums come from the same logits chunk by chunk, so the statistics agree within
#: fp32 round-off of sums over the batch (a few ε₃₂ of each term's magnitude).
REL = 64 * 1.2e-7
ROLLOUT = ("reward/mean", "reward/group_signal_frac", "response/length_mean", "fidelity/kl")
LAYOUT = ("perf/pad_fraction", "perf/dp_imbalance", "perf/micro_batches")


@pytest.mark.parametrize("method", ["opefo", "grpo_strict"])
def test_probe_equals_the_first_training_step(make_trainer, tmp_path, method):
    probed = probe(make_trainer([f"method={method}"], tmp_path / "probe"))
    assert set(probed.estimators) == set(ESTIMATORS)
    for estimator in ESTIMATORS:
        trainer = make_trainer(
            [f"method={method}", f"method.entropy_flow.estimator={estimator}"],
            tmp_path / estimator,
        )
        logged = trainer.train_step()
        ours = probed.estimators[estimator]
        assert_metrics_close(ours, {name: logged[name] for name in ours}, REL)
        for name in ROLLOUT:
            assert probed.rollout[name] == pytest.approx(logged[name], rel=REL, abs=1e-12), name
        for name in LAYOUT:  # the same lengths planned alike
            assert probed.rollout[name] == logged[name], name
    assert 0 < probed.rollout["reward/group_signal_frac"] <= 1


def test_the_command_writes_table_verdict_and_json(warm_model, tmp_path, capsys):
    path = tmp_path / "probe.json"
    overrides = run_overrides(warm_model, tmp_path / "run")
    assert main(["--json", str(path), *overrides]) == 0
    out = capsys.readouterr().out
    document = json.loads(path.read_text())
    assert document["overrides"] == overrides
    assert set(document["estimators"]) == set(ESTIMATORS)
    paper = document["estimators"]["paper"]
    lam = (paper["flow/neg"] - paper["flow/pos"]) / (paper["flow/neg"] + paper["flow/pos"])
    # |λ| <= 1: one float64 division and subtraction of the same sums, a few ulps of 1
    assert paper["flow/lambda"] == pytest.approx(lam, abs=1e-12)
    for name in paper:
        assert name in out, name
    assert f"w+ = 1 + λ* = {1 + paper['flow/lambda']:.3f}" in document["verdict"]
    assert document["verdict"] in out.replace("\nverdict: ", "\n")
    assert "by the groups' success rate" in out


def test_group_flows_add_up_to_the_batch_and_follow_the_rewards(make_trainer, tmp_path):
    """Each group's rows are those of one prompt: its success rate is its reward mean (DAPO-like
    0/1 task rewards), groups with equal rewards carry no flow, and the groups add up to P, N."""
    result = probe(make_trainer(["trainer.prompts_per_step=8"], tmp_path))
    for estimator, groups in result.groups.items():
        metrics = result.estimators[estimator]
        assert [g.prompt for g in groups] == list(range(8))
        assert all(g.responses == result.responses for g in groups)
        flows = metrics["flow/pos"] + metrics["flow/neg"]
        # float64 sums of the same fp32 ΔH in another order; tokens ≤ 8 × 4 × 24
        bound = 8 * 4 * 24 * 2.0**-53 * flows
        assert abs(sum(g.pos for g in groups) - metrics["flow/pos"]) <= bound
        assert abs(sum(g.neg for g in groups) - metrics["flow/neg"]) <= bound
        for group in groups:
            if group.correct in (0, group.responses):
                assert group.pos == group.neg == 0.0 and group.lam is None
            else:
                assert group.pos + group.neg > 0
        signal = sum(0 < g.correct < g.responses for g in groups) / len(groups)
        assert signal == pytest.approx(result.rollout["reward/group_signal_frac"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.no_such_key=1"], "unknown key trainer.no_such_key"),
        (["run.compare=[grpo_strict,opefo]"], "run.compare and run.seeds"),
        (["model=local", "model.path=/nonexistent/model"], "/nonexistent/model does not exist"),
    ],
)
def test_start_up_problems_are_one_line_and_exit_2(overrides, message, capsys):
    assert main(overrides) == 2
    line = re.split(r"[\r\n]", capsys.readouterr().err.strip())[-1]  # after the progress bar
    assert line.startswith("opefo-probe: error:") and message in line
