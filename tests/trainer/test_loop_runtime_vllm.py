"""Run-time behaviour with the real vLLM engine: server death, pre-emption, validation, eval."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
from fractions import Fraction

import pytest
import torch
import yaml

from opefo_nemo.cli import eval as eval_cli
from opefo_nemo.config.compose import compose
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.trainer.checkpoint import list_checkpoints
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import arithmetic_split, start_rollout

pytestmark = pytest.mark.vllm


def _kill_servers(rollout) -> None:
    for pid in rollout.engine.server_pids:
        os.kill(pid, signal.SIGKILL)


def test_a_dead_rollout_server_is_restarted_once_then_fails_clearly(warm_model):
    overrides = ["model=tiny_arithmetic", f"model.path={warm_model}", "rollout.max_restarts=1"]
    config, _ = compose(overrides)
    from opefo_nemo.engines.hf import HFPolicy

    policy = HFPolicy(warm_model, config.engine, lr=1e-3, temperature=1.0)
    rollout = start_rollout(config, warm_model, policy.named_weights)
    sampling = SamplingConfig(max_new_tokens=4, stop_token_ids=(2,), seed=0)
    prompts = [[1, 4, 15, 5, 49]]
    try:
        first = rollout.generate(prompts, 2, sampling)
        _kill_servers(rollout)
        again = rollout.generate(prompts, 2, sampling)
        assert rollout.restarts == 1
        assert [c.token_ids for c in again] == [c.token_ids for c in first]
        _kill_servers(rollout)
        with pytest.raises(RuntimeError, match=r"restarted 1 time\(s\) \(rollout.max_restarts=1\)"):
            rollout.generate(prompts, 2, sampling)
    finally:
        rollout.close()


def test_weight_updates_sleep_and_wake_restart_a_dead_server_with_the_current_weights(warm_model):
    """A server killed before a weight update, a sleep or a wake is restarted by that request, and
    the restarted server holds the weights the guard's source gives now (moved away from the
    model directory's), not the directory's: it samples what the moved weights sampled."""
    overrides = ["model=tiny_arithmetic", f"model.path={warm_model}", "rollout.max_restarts=3"]
    config, _ = compose(overrides)
    from opefo_nemo.engines.hf import HFPolicy

    policy = HFPolicy(warm_model, config.engine, lr=1e-3, temperature=1.0)
    noise = torch.Generator().manual_seed(0)
    current = {
        name: weight + weight.std() * torch.randn(weight.shape, generator=noise)
        for name, weight in policy.named_weights()
    }
    rollout = start_rollout(config, warm_model, lambda: iter(current.items()))
    sampling = SamplingConfig(max_new_tokens=8, stop_token_ids=(), seed=0)
    prompts = [[1, 4, 15, 5, 49], [1, 7, 3, 5, 12]]

    def sample() -> list[list[int]]:
        return [c.token_ids for c in rollout.generate(prompts, 4, sampling)]

    try:
        from_directory = sample()
        rollout.update_weights(current.items())
        moved = sample()
        assert moved != from_directory  # else the check below could not tell the weights apart
        requests = (lambda: rollout.update_weights(current.items()), rollout.sleep, rollout.wake)
        for restarts, request in enumerate(requests, start=1):
            _kill_servers(rollout)
            request()
            assert rollout.restarts == restarts
            assert sample() == moved
        _kill_servers(rollout)
        with pytest.raises(RuntimeError, match=r"restarted 3 time\(s\) \(rollout.max_restarts=3\)"):
            rollout.sleep()
    finally:
        rollout.close()


def test_sigusr1_checkpoints_after_the_current_step_and_stops(make_trainer, tmp_path):
    trainer = make_trainer(["trainer.max_steps=50"], tmp_path / "run")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        status = trainer.run()
    finally:
        timer.cancel()
    assert status == "preempted"
    assert 1 <= trainer.step < 50
    (checkpoint,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == trainer.step
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == list(
        range(1, trainer.step + 1)
    )
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_validation_avg_and_pass_at_k_match_opefo_eval(make_trainer, warm_model, tmp_path):
    """The trainer's validation samples what ``opefo-eval`` samples (same weights, sampling and
    seed): its avg@4 is the table's, and its pass@1, pass@2, pass@4 are the fractions of all
    k-subsets of each problem's samples in ``opefo-eval``'s ``samples.jsonl`` holding a correct
    one (a brute force over the raw per-sample results)."""
    trainer = make_trainer(["trainer.max_steps=0", "validation.k=4"], tmp_path / "run")
    metrics = trainer.validate()
    assert sorted(metrics) == ["val/avg@4", "val/pass@1", "val/pass@2", "val/pass@4"]
    from_trainer = metrics["val/avg@4"]
    assert 0 < from_trainer < 1

    config, _ = compose(["model=tiny_arithmetic", f"model.path={warm_model}"])
    _, validation = arithmetic_split(config.data)
    bench = tmp_path / "arith.jsonl"
    rows = [json.dumps({"problem": p.problem, "answer": p.ground_truth}) for p in validation]
    bench.write_text("\n".join(rows) + "\n")
    args = [str(warm_model), "--file", f"arith={bench}", "--samples", "4"]
    args += ["--verifier", "arithmetic"]
    args += ["--max-new-tokens", "24", "--max-model-len", "64", "--out", str(tmp_path / "eval")]
    assert eval_cli.main(args) == 0
    report = json.loads((tmp_path / "eval" / "results.json").read_text())
    text = json.dumps(report)
    assert "arith" in text
    md = (tmp_path / "eval" / "results.md").read_text()
    assert f"{100 * from_trainer:.1f}" in md
    assert md.splitlines()[0] == "avg@k, verifier arithmetic"
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").open()]
    correct: dict[int, list[bool]] = {}
    for row in samples:
        correct.setdefault(row["problem"], []).append(row["correct"])
    assert len(correct) == len(validation) and {len(c) for c in correct.values()} == {4}
    for k in (1, 2, 4):
        per_problem = [
            Fraction(sum(map(any, subsets)), len(subsets))
            for subsets in (list(itertools.combinations(c, k)) for c in correct.values())
        ]
        assert metrics[f"val/pass@{k}"] == float(sum(per_problem) / len(per_problem)), k
    assert metrics["val/pass@4"] > metrics["val/pass@1"]  # some problems are solved rarely


def test_opefo_train_compares_methods_over_seeds_and_writes_the_report(warm_model, tmp_path):
    """run.compare × run.seeds: each method trains once per seed from the same start. At one
    seed both methods' first rollouts are identical (same weights, prompts and sampling seeds);
    the other seed draws other prompts and samples. Each run records its method and seed, and
    the report groups the seeds of each method."""
    from opefo_nemo.cli import train as train_cli

    root = tmp_path / "cmp"
    overrides = [
        "model=tiny_arithmetic",
        f"model.path={warm_model}",
        f"run.output_dir={root}",
        "run.compare=[grpo_strict,opefo]",
        "run.seeds=[0,1]",
        "trainer.max_steps=2",
        "trainer.prompts_per_step=4",
        "trainer.responses_per_prompt=4",
        "metrics.progress=false",
        "validation.every=2",
        "validation.k=2",
    ]
    assert train_cli.main(overrides) == 0
    first = {}
    for method in ("grpo_strict", "opefo"):
        for seed in (0, 1):
            run = root / method / f"seed_{seed}"
            records = read_metrics(run / "metrics.jsonl")
            # step 0: the warm start's validation, before any update
            assert [r["step"] for r in records] == [0, 1, 2]
            assert sorted(records[0]) == ["step", "val/avg@2", "val/pass@1", "val/pass@2"]
            recorded = yaml.safe_load((run / "config.yaml").read_text())
            assert (recorded["method"]["name"], recorded["run"]["seed"]) == (method, seed)
            assert 0 <= records[-1]["val/avg@2"] <= 1
            assert records[-1]["val/pass@1"] == records[-1]["val/avg@2"]
            assert list((run / "tensorboard").glob("events.out.tfevents.*"))
            first[method, seed] = records[1]
    same_start = ("entropy/mean", "reward/mean", "response/length_mean")
    for seed in (0, 1):
        for key in same_start:
            assert first["grpo_strict", seed][key] == first["opefo", seed][key], (seed, key)
    assert first["opefo", 0]["entropy/mean"] != first["opefo", 1]["entropy/mean"]
    assert (root / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (root / "summary.md").read_text()
    assert "| grpo_strict | 0, 1 | 2 |" in table and "| opefo | 0, 1 | 2 |" in table
