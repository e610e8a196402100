"""The loop on two ranks (real gloo group, real vLLM CPU servers) against one process.

References: the single-process trainer on the same model, data and seeds (its metrics, step by
step), and one vLLM engine's completions of the same prompts (greedy: Hugging Face-exact; seeded:
prompt ``i`` sampled with seed ``seed + i · n`` whichever server serves it).
"""

from __future__ import annotations

import datetime
import json

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer
from tests.metric_bounds import assert_metrics_close
from tests.parallel.world import run_world
from tests.trainer import workers_spmd
from tests.trainer.small_run import run_overrides

pytestmark = pytest.mark.vllm

SERVER_START = {"group_timeout": datetime.timedelta(seconds=300), "deadline_s": 900.0}
STEADY = ("time/", "rollout/restarts")


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(STEADY)}


def test_two_ranks_stop_together_resume_and_match_one_process(make_trainer, warm_model, tmp_path):
    extra = ["trainer.max_steps=3", "checkpoint.every=0"]
    reference = make_trainer(extra, tmp_path / "single")
    assert reference.run() == "done"
    expected = [_comparable(row) for row in read_metrics(tmp_path / "single" / "metrics.jsonl")]

    out = tmp_path / "spmd"
    overrides = run_overrides(warm_model, out, extra)
    run_world(workers_spmd.preempt_and_resume, 2, overrides, str(out), **SERVER_START)

    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0] == reports[1]  # same decisions on both ranks
    stops = reports[0]["stops"]
    assert stops[0] == stops[1] and stops[0][0] == "preempted"  # rank 0 never got the signal
    stopped_at = stops[0][1]
    assert 1 <= stopped_at < 3 and reports[0]["resumed_at"] == stopped_at
    assert reports[0]["final"] == ["done", 3]
    checkpoint = out / "checkpoints" / f"step_{stopped_at:06d}"
    for name in ("trainer_state.json", "rng.pt", "rng_rank1.pt", "config.yaml", "policy"):
        assert (checkpoint / name).exists(), name
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]  # rank 0 alone logs, each step once
    got = [_comparable(row) for row in rows]
    for a, b in zip(got, expected, strict=True):
        assert_metrics_close(a, b, rel=1e-5)


def test_two_servers_split_prompts_like_one_and_restart_collectively(
    shared_rollout, warm_model, tmp_path
):
    overrides = run_overrides(warm_model, tmp_path / "run")
    run_world(workers_spmd.shared_generation, 2, overrides, str(tmp_path), **SERVER_START)
    result = json.loads((tmp_path / "spmd.json").read_text())
    assert result["ranks_agree"]

    config, _ = compose(overrides)
    codec = PromptCodec(warm_model, config.data.template)
    prompts = result["prompts"]
    seeded = SamplingConfig(
        temperature=1.0, max_new_tokens=8, seed=123, stop_token_ids=(codec.eos_id,)
    )
    single = build_trainer(config, compose(overrides)[1], tmp_path / "single", shared_rollout)
    greedy = single.rollout.generate(prompts, 1, SamplingConfig(0.0, max_new_tokens=8))
    sampled = single.rollout.generate(prompts, 3, seeded)
    as_lists = lambda cs: [[c.prompt_index, c.token_ids] for c in cs]  # noqa: E731
    assert result["greedy"] == as_lists(greedy)
    assert result["seeded"] == as_lists(sampled)  # seeds follow the global prompt index
    assert result["after_restart"] == as_lists(sampled)  # the restarted server got the weights
    assert result["restarts"] == [1, 1]  # counted on every rank
    for message in result["second_death"]:
        assert message.startswith("rank 1 lost its rollout server, already restarted 1 time(s)")


def test_hf_engine_refuses_several_ranks(warm_model, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    config, config_dict = compose(run_overrides(warm_model, tmp_path))
    with pytest.raises(ValueError, match="engine=hf trains in one process, but this run has"):
        build_trainer(config, config_dict, tmp_path)
