"""The comparison report: moving averages, summary numbers, the PNG."""

from __future__ import annotations

import pytest

from opefo_nemo.trainer.report import moving_average, summary_rows, write_comparison


def fake_run(entropy_start: float, slope: float, steps: int = 25):
    return [
        {
            "step": s + 1,
            "entropy/mean": entropy_start + slope * s,
            "reward/mean": 0.1 * (s % 3),
            "flow/lambda": -0.5 if s % 2 else 0.25,
            "flow/pos": 1.0,
            "flow/neg": 2.0,
            "flow/net_after_balance": 0.0,
            "response/length_mean": 3.0,
            **({"flow/realized": 0.01} if s % 5 == 4 else {}),
        }
        for s in range(steps)
    ]


def test_moving_average_against_a_direct_window_mean():
    values = [float(v * v % 7) for v in range(23)]
    for width in (1, 3, 10):
        direct = [sum(values[max(0, i - width + 1) : i + 1]) / min(width, i + 1) for i in range(23)]
        assert moving_average(values, width) == pytest.approx(direct)


def test_summary_rows_use_first_and_last_ten_steps():
    runs = {"a": fake_run(1.0, -0.01), "b": fake_run(0.5, 0.0)}
    row_a, row_b = summary_rows(runs)
    assert row_a["entropy_first"] == pytest.approx(1.0 - 0.01 * 4.5)
    assert row_a["entropy_last"] == pytest.approx(1.0 - 0.01 * 19.5)
    assert row_b["entropy_change"] == pytest.approx(0.0)
    assert row_a["mean_abs_lambda"] == pytest.approx((13 * 0.25 + 12 * 0.5) / 25)
    assert row_a["realized_sum"] == pytest.approx(0.05)


def test_write_comparison_writes_png_and_table(tmp_path):
    png = write_comparison({"grpo_strict": fake_run(1, -0.01), "opefo": fake_run(1, 0)}, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "summary.md").read_text()
    assert "| grpo_strict |" in table and "| opefo |" in table


def test_metrics_logger_drops_steps_after_the_resumed_checkpoint(tmp_path):
    from opefo_nemo.config.train import MetricsConfig
    from opefo_nemo.trainer.metrics_log import MetricsLogger, read_metrics

    config = MetricsConfig(tensorboard=False, progress=False)
    logger = MetricsLogger(tmp_path, config, "run", 10, 0, {})
    for step in range(1, 8):
        logger.log(step, {"reward/mean": step / 10, "grad/norm": float("nan")})
    logger.close()
    resumed = MetricsLogger(tmp_path, config, "run", 10, 5, {})
    resumed.log(6, {"reward/mean": 0.66})
    resumed.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[-1]["reward/mean"] == 0.66
    assert records[0]["grad/norm"] is None


def test_metrics_logger_logs_to_wandb_in_offline_mode(tmp_path):
    from opefo_nemo.config.train import MetricsConfig, WandbConfig
    from opefo_nemo.trainer.metrics_log import MetricsLogger

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
