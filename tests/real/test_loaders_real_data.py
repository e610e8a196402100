"""Real public data end to end with the real model: DAPO-Math-17k in verl's parquet trains one
step of SmolLM2 through ``data=dapo_math``, and ``opefo-eval`` scores subsets of AIME24,
MATH-500 and GSM8K from their verl parquet files with avg@k and pass@k.

The files are looked for in ``$OPEFO_TEST_DATA``, else in ``../shared/data`` from the root of
the checkout; every test here is skipped, with the reason, where they are absent (the
repository does not ship them; docs/cluster.md says where to get them).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.data import load_problems
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer

EPS64 = sys.float_info.epsilon
pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "dapo": "DAPO-Math-17k.parquet",
    "aime24": "aime24.parquet",
    "math500": "math500.parquet",
    "gsm8k": "gsm8k_test.parquet",
}


@pytest.fixture(scope="module")
def data_dir() -> Path:
    found = Path(os.environ.get("OPEFO_TEST_DATA", ROOT.parent / "shared" / "data"))
    missing = [name for name in FILES.values() if not (found / name).is_file()]
    if missing:
        pytest.skip(f"real data absent: {', '.join(missing)} not in {found} (set OPEFO_TEST_DATA)")
    return found


def test_the_public_files_load_with_their_problem_counts(data_dir):
    """Each file's distinct problems (aime24 repeats each of its 30 for avg@32)."""
    counts = {key: len(load_problems(data_dir / name)) for key, name in FILES.items()}
    assert counts == {"dapo": 17398, "aime24": 30, "math500": 500, "gsm8k": 1319}


def test_dapo_math_trains_a_step_of_smollm2(data_dir, smollm2_dir, tmp_path):
    overrides = [
        "+preset=smollm2_cpu",
        "data=dapo_math",
        f"data.train={data_dir / FILES['dapo']}",
        f"model.path={smollm2_dir}",
        "reward.verifier=dapo",  # DAPO's "Answer:" line (data=dapo_math's template)
        "trainer.prompts_per_step=2",
        "trainer.responses_per_prompt=2",
        "trainer.max_steps=1",
        "engine.micro_batch_size=4",
        "rollout.max_new_tokens=16",
        "checkpoint.every=0",
        "metrics.progress=false",
        "metrics.tensorboard=false",
        f"run.output_dir={tmp_path}",
    ]
    config, config_dict = compose(overrides)
    trainer = build_trainer(config, config_dict, tmp_path)
    try:
        assert len(trainer.train.problems) > 17000  # the few prompts over 1024 tokens skipped
        assert trainer.run() == "done"
    finally:
        trainer.rollout.close()
    (step,) = read_metrics(tmp_path / "metrics.jsonl")
    assert step["step"] == 1
    assert 1 <= step["response/length_mean"] <= 16
    assert step["reward/mean"] in (-1.0, -0.5, 0.0, 0.5, 1.0)  # 4 responses scored ±1
    assert math.isfinite(step["entropy/mean"]) and step["entropy/mean"] > 0
    assert math.isfinite(step["grad/norm"])


def _pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` of ``n`` samples correct."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_opefo_eval_scores_aime24_math500_gsm8k_subsets(data_dir, smollm2_dir, tmp_path):
    """Three problems of each set, four samples each: the table's avg@4 and pass@2 / pass@4 equal
    those recomputed from samples.jsonl (per problem: how many of its samples scored correct)."""
    from opefo_nemo.cli import eval as eval_cli

    out = tmp_path / "eval"
    names = ("aime24", "math500", "gsm8k")
    argv = [str(smollm2_dir), "--samples", "4", "--max-problems", "3", "--max-new-tokens", "48"]
    argv += ["--max-model-len", "2048", "--verifier", "dapo", "--out", str(out)]
    for name in names:
        argv += ["--file", f"{name}={data_dir / FILES[name]}"]
    assert eval_cli.main(argv) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    (row,) = json.loads((out / "results.json").read_text()).values()
    for name in names:
        rows = [s for s in samples if s["benchmark"] == name]
        assert sorted((s["problem"], s["sample"]) for s in rows) == [
            (p, j) for p in range(3) for j in range(4)
        ]
        correct = [sum(s["correct"] for s in rows if s["problem"] == p) for p in range(3)]
        score = row["benchmarks"][name]
        assert score["problems"] == 3 and score["samples"] == 4
        # means of 0/1 values: a rounding per sum term and per division
        assert score["avg_at_k"] == pytest.approx(sum(correct) / 12, rel=16 * EPS64)
        assert sorted(score["pass_at_k"], key=int) == ["2", "4"]  # pass@1 is avg@4
        for k in (2, 4):
            want = sum(_pass_at_k(4, c, k) for c in correct) / 3
            # 1 − a product of k ratios ≤ 1 (2k + 1 roundings of at most 1), averaged over 3
            assert score["pass_at_k"][str(k)] == pytest.approx(want, abs=(2 * k + 5) * EPS64)
