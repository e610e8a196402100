"""Strict GRPO on the demo's task in ``engine.dtype=bfloat16`` (mixed precision) against the same
runs in fp32, three seeds each from the same warm start: bf16 learns, and its reward and entropy
follow fp32's within the seeds' spread (docs/studies/bf16_precision.md, "bf16 mixed precision
against fp32")."""

from __future__ import annotations

import statistics

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer

SEEDS = (0, 1, 2)
STEPS = 24
WINDOW = 8  # steps averaged at each end of a run


def run(model, out, dtype: str, seed: int) -> dict[str, float]:
    """Means of reward and entropy over the first and the last WINDOW steps of one run."""
    config, config_dict = compose(
        [
            f"model.path={model}",
            f"run.output_dir={out}",
            "rollout=engine",
            "method=grpo_strict",
            f"engine.dtype={dtype}",
            f"trainer.max_steps={STEPS}",
            "trainer.prompts_per_step=16",
            f"run.seed={seed}",
            "metrics.progress=false",
            "metrics.tensorboard=false",
            "metrics.realized_every=0",
            "checkpoint.every=0",
        ]
    )
    assert build_trainer(config, config_dict, out).run() == "done"
    records = [r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r]
    assert len(records) == STEPS and all(r["train/skipped_updates"] == 0 for r in records)
    ends = {"first": records[:WINDOW], "last": records[-WINDOW:]}
    return {
        f"{key}_{end}": statistics.fmean(r[metric] for r in rows)
        for end, rows in ends.items()
        for key, metric in (("reward", "reward/mean"), ("entropy", "entropy/mean"))
    }


@pytest.mark.slow
def test_bf16_mixed_precision_follows_fp32_within_the_seeds_spread(demo_model, tmp_path):
    runs = {
        dtype: [run(demo_model, tmp_path / f"{dtype}_{s}", dtype, s) for s in SEEDS]
        for dtype in ("float32", "bfloat16")
    }
    for dtype, results in runs.items():  # both learn: reward up, entropy down (strict GRPO)
        for r in results:
            assert r["reward_last"] > r["reward_first"], (dtype, r)
            assert r["entropy_last"] < r["entropy_first"], (dtype, r)
    for key in ("reward_last", "entropy_last"):
        fp32 = [r[key] for r in runs["float32"]]
        bf16 = [r[key] for r in runs["bfloat16"]]
        spread = (max(fp32) - min(fp32)) + (max(bf16) - min(bf16))
        gap = abs(statistics.fmean(bf16) - statistics.fmean(fp32))
        print(f"{key}: fp32 {fp32}, bf16 {bf16}, gap {gap:.4f}, spread {spread:.4f}")
        assert gap <= spread, (key, fp32, bf16)
