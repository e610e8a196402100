"""The run directory's files: ``metrics.jsonl`` and ``lengths.jsonl`` across a resume,
``config.yaml``, W&B offline."""

from __future__ import annotations

import json

import yaml

from opefo_nemo.config.compose import compose
from opefo_nemo.config.metrics import MetricsConfig, WandbConfig
from opefo_nemo.trainer.metrics_log import SUPERSEDED, MetricsLogger, read_metrics


def test_metrics_logger_sets_aside_steps_after_the_resumed_checkpoint(tmp_path, caplog):
    """Steps 6 and 7 were logged after the checkpoint of step 5: the resumed run's metrics.jsonl
    holds each step once (the warm start's step 0 included), and the two earlier records are kept
    in metrics.superseded.jsonl; a run that starts again at step 0 moves every record there (it
    logs step 0 again), so no step appears twice and none is lost."""
    config = MetricsConfig(tensorboard=False, progress=False)
    logger = MetricsLogger(tmp_path, config, "run", 10, 0, {})
    logger.log(0, {"val/pass@1": 0.5})
    for step in range(1, 8):
        logger.log(step, {"reward/mean": step / 10, "grad/norm": float("nan")})
    logger.close()
    first = (tmp_path / "metrics.jsonl").read_text().splitlines()
    resumed = MetricsLogger(tmp_path, config, "run", 10, 5, {})
    resumed.log(6, {"reward/mean": 0.66})
    resumed.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5, 6]
    assert records[-1]["reward/mean"] == 0.66
    assert records[1]["grad/norm"] is None
    assert (tmp_path / SUPERSEDED).read_text().splitlines() == first[6:]
    assert "2 record(s) after step 5" in caplog.text
    # A run that continues at its end moves nothing.
    MetricsLogger(tmp_path, config, "run", 10, 6, {}).close()
    kept = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(kept) == 7
    assert (tmp_path / SUPERSEDED).read_text().splitlines() == first[6:]
    again = MetricsLogger(tmp_path, config, "run", 10, 0, {})
    again.log(0, {"val/pass@1": 0.25})
    again.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "val/pass@1": 0.25}]
    assert (tmp_path / SUPERSEDED).read_text().splitlines() == first[6:] + kept


def test_lengths_are_set_aside_after_the_resumed_checkpoint_like_the_metrics(tmp_path):
    """``lengths.jsonl``: one compact line a step with each row's prompt and response tokens;
    a resumed run moves the later steps' lines to ``lengths.superseded.jsonl``."""
    config = MetricsConfig(tensorboard=False, progress=False)
    logger = MetricsLogger(tmp_path, config, "run", 10, 0, {})
    for step in range(1, 5):
        logger.log_lengths(step, [7, 7, 9], [step, 120, 3000])
    logger.close()
    first = (tmp_path / "lengths.jsonl").read_text().splitlines()
    assert json.loads(first[0]) == {
        "step": 1,
        "prompt_tokens": [7, 7, 9],
        "response_tokens": [1, 120, 3000],
    }
    assert len(first[0]) == len('{"step":1,"prompt_tokens":[7,7,9],"response_tokens":[1,120,3000]}')
    resumed = MetricsLogger(tmp_path, config, "run", 10, 2, {})
    resumed.log_lengths(3, [5], [6])
    resumed.close()
    lines = (tmp_path / "lengths.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert (tmp_path / "lengths.superseded.jsonl").read_text().splitlines() == first[2:]
    assert not (tmp_path / SUPERSEDED).exists()


def test_metrics_logger_logs_to_wandb_in_offline_mode(tmp_path):
    config = MetricsConfig(
        tensorboard=False, progress=False, wandb=WandbConfig(enabled=True, mode="offline")
    )
    logger = MetricsLogger(tmp_path, config, "wandb_run", 2, 0, {"method": {"name": "opefo"}})
    run = logger._wandb
    logger.log(1, {"reward/mean": 0.25, "flow/lambda": 0.5})
    logger.log(2, {"reward/mean": 0.75, "flow/lambda": -0.1})
    logger.log(3, {"reward/mean": 0.5, "flow/lambda": 0.0})
    # W&B commits a step's row when the next step starts: step 2 is in the summary now.
    assert run.summary["reward/mean"] == 0.75
    assert run.summary["flow/lambda"] == -0.1
    assert run.config["method"] == {"name": "opefo"}
    logger.close()
    assert len(list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))) == 1


def test_metrics_logger_records_the_runs_configuration(tmp_path):
    """config.yaml holds the composed configuration, so a report reads method and seed from it."""
    _, config_dict = compose(["method=clip_higher", "run.seed=7", "trainer.max_steps=3"])
    logger = MetricsLogger(
        tmp_path, MetricsConfig(tensorboard=False, progress=False), "r", 3, 0, config_dict
    )
    logger.close()
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written == config_dict
    assert written["method"]["name"] == "clip_higher"
    assert written["run"]["seed"] == 7
