"""``opefo-eval calibrate`` on the demo's tiny model: every problem's count against one plain
generation of all samples with the same row seeds, scored and counted here; a band selects by
those counts without drawing again; an interrupted run draws only the rest, and two worker
processes and two merged shards draw the same counts; a real Ctrl-C keeps what was counted; the
trainer validates on the held-out file; bad input stops with one line naming the option."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from opefo_nemo.cli import eval as eval_cli
from opefo_nemo.cli.sample_counts import sample_seed
from opefo_nemo.config.compose import compose
from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.data import load_jsonl
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.engines.hf_generation import HFGenerator
from opefo_nemo.models.transformers_compat import load_causal_lm
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.trainer.scoring import score_responses
from opefo_nemo.trainer.setup import build_trainer, generated_split

N, PROBLEMS, ROWS, NEW_TOKENS = 8, 4, 16, 24
POOL = ["--pool", "data=arithmetic", "--set", f"data.arithmetic.num_validation={PROBLEMS}"]


def command(model, out, *extra: str) -> list[str]:
    return [
        "calibrate", str(model), *POOL, "--verifier", "arithmetic", "--samples", str(N),
        "--max-new-tokens", str(NEW_TOKENS), "--batch-rows", str(ROWS), "--dtype", "float32",
        "--generator", "hf", "--out", str(out), *extra,
    ]  # fmt: skip


def reference_counts(model) -> list[int]:
    """Every sample of the pool in one call, row seeds ``base + i·n + j``, ``ROWS`` rows a
    forward (the calibration's forwards: two problems of 8 samples each), scored and counted."""
    data = compose(["data=arithmetic", f"data.arithmetic.num_validation={PROBLEMS}"])[0].data
    problems = generated_split("arithmetic", data)[1]
    codec = PromptCodec(model, "raw")
    network = load_causal_lm(model, torch.float32).eval()
    generator = HFGenerator(network, torch.device("cpu"), codec.pad_id, ROWS)
    sampling = SamplingConfig(
        temperature=1.0, top_p=0.7, max_new_tokens=NEW_TOKENS,
        stop_token_ids=stop_tokens(codec).ids, seed=sample_seed("calibrate", 0),
    )  # fmt: skip
    completions = generator.generate([codec.encode(p) for p in problems], N, sampling)
    results = score_responses(
        [codec.decode(c.token_ids) for c in completions],
        [problems[c.prompt_index].ground_truth for c in completions],
        RewardConfig(verifier="arithmetic"),
    )
    return [sum(results[i * N + j].correct for j in range(N)) for i in range(len(problems))]


def counted(out) -> list[int]:
    lines = (out / "counts.jsonl").read_text().splitlines()[1:]
    rows = sorted((json.loads(line) for line in lines), key=lambda row: row["index"])
    assert [row["index"] for row in rows] == list(range(PROBLEMS))
    return [row["correct"] for row in rows]


@pytest.fixture(scope="module")
def calibrated(demo_model, tmp_path_factory):
    """One calibration keeping every problem (band 0-8), and the reference counts."""
    out = tmp_path_factory.mktemp("calibration")
    assert eval_cli.main(command(demo_model, out, "--band", f"0-{N}")) == 0
    return out, reference_counts(demo_model)


def test_counts_match_one_plain_generation_and_a_band_selects_by_them(
    calibrated, demo_model, tmp_path
):
    out, want = calibrated
    assert counted(out) == want
    summary = json.loads((out / "calibration.json").read_text())
    assert summary["selected"] == PROBLEMS and summary["band"] == f"0-{N}"
    assert summary["histogram"] == {str(c): want.count(c) for c in sorted(set(want))}
    assert summary["cost"]["samples"] == PROBLEMS * N
    # the first problem's count as the band: the same counts, drawn no more, select again
    band = tmp_path / "band"
    shutil.copytree(out, band)
    assert eval_cli.main(command(demo_model, band, "--band", str(want[0]))) == 0
    heldout = [json.loads(line) for line in (band / "heldout.jsonl").read_text().splitlines()]
    assert [row["calibration"] for row in heldout] == [
        {"correct": c, "samples": N} for c in want if c == want[0]
    ]
    assert json.loads((band / "calibration.json").read_text())["cost"]["samples"] == 0


def test_an_interrupted_run_draws_only_the_rest(calibrated, demo_model, tmp_path, caplog):
    out, want = calibrated
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    lines = (out / "counts.jsonl").read_text().splitlines()
    rows = {json.loads(line)["index"]: line for line in lines[1:]}
    kept = [lines[0]] + [rows[i] for i in (0, 1)]  # problems 2 and 3 never finished
    (resumed / "counts.jsonl").write_text("\n".join(kept) + "\n")
    with caplog.at_level(logging.INFO, logger="opefo_nemo.eval"):
        assert eval_cli.main(command(demo_model, resumed, "--band", f"0-{N}")) == 0
    assert "drawing 8 samples of 2 problems (2 already counted)" in caplog.text
    assert counted(resumed) == want
    assert len(load_jsonl(resumed / "heldout.jsonl")) == PROBLEMS
    summary = json.loads((resumed / "calibration.json").read_text())
    assert summary["cost"]["samples"] == 2 * N


def test_two_worker_processes_give_the_same_counts(calibrated, demo_model, tmp_path):
    _, want = calibrated
    args = command(demo_model, tmp_path / "workers", "--workers", "2")
    assert eval_cli.main([*args, "--threads", "1"]) == 0
    assert counted(tmp_path / "workers") == want


def test_shards_merged_give_the_same_counts(calibrated, demo_model, tmp_path, caplog):
    _, want = calibrated
    lines = []
    for shard in ("0/2", "1/2"):  # problems 0-1 and 2-3, each one forward of 16 rows
        out = tmp_path / shard.replace("/", "_")
        assert eval_cli.main(command(demo_model, out, "--shard", shard)) == 0
        assert not (out / "heldout.jsonl").exists()
        lines.append((out / "counts.jsonl").read_text().splitlines())
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "counts.jsonl").write_text("\n".join(lines[0] + lines[1][1:]) + "\n")
    with caplog.at_level(logging.INFO, logger="opefo_nemo.eval"):
        assert eval_cli.main(command(demo_model, merged, "--band", f"0-{N}")) == 0
    assert f"all {PROBLEMS} problems already counted" in caplog.text
    assert counted(merged) == want


def test_training_validates_on_the_heldout_file(calibrated, demo_model, tmp_path):
    out, _ = calibrated
    heldout = out / "heldout.jsonl"
    config, config_dict = compose([
        f"model.path={demo_model}", f"run.output_dir={tmp_path / 'run'}", "rollout=engine",
        f"data.validation={heldout}", "validation.k=4", "metrics.tensorboard=false",
    ])  # fmt: skip
    trainer = build_trainer(config, config_dict, tmp_path / "run")
    assert trainer.validation is not None
    assert trainer.validation.problems == load_jsonl(heldout)
    metrics = trainer.validate()
    assert sorted(metrics) == ["val/avg@4", "val/pass@1", "val/pass@2", "val/pass@4"]
    assert 0.0 <= metrics["val/pass@1"] <= metrics["val/pass@2"] <= metrics["val/pass@4"] <= 1


def test_bad_input_stops_with_one_line_naming_the_option(calibrated, demo_model, tmp_path, capsys):
    out, want = calibrated
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    empty = next(c for c in range(N + 1) if c not in want)
    cases = {
        f"--band {empty}-{empty} selects none of the {PROBLEMS} problems": ["--band", str(empty)],
        "--band 1-9: need 0 <= LOW <= HIGH <= --samples (8)": ["--band", "1-9"],
        "--samples must be >= 2": ["--samples", "1"],
        "--shard 2/2: expected I/N with 0 <= I < N": ["--shard", "2/2"],
    }
    for expected, extra in cases.items():
        assert eval_cli.main(command(demo_model, copy, *extra)) == 2, expected
        err = capsys.readouterr().err
        assert err.startswith("opefo-eval calibrate: error:") and expected in err, err
        assert err.count("\n") == 1, err
    missing = ["calibrate", str(demo_model), "--pool", str(tmp_path / "none.jsonl")]
    assert eval_cli.main(missing) == 2
    assert "data file not found" in capsys.readouterr().err


def test_an_interrupt_keeps_the_finished_problems(demo_model, tmp_path):
    # a real Ctrl-C (SIGINT) once two problems are written: exit 130, one line saying where the
    # counts are, no traceback, and every line written is a whole problem's count
    out = tmp_path / "interrupted"
    argv = command(demo_model, out, "--band", f"0-{N}", "--batch-rows", str(N))
    # a draw of minutes (2,000 problems), so that it is still running when the signal comes
    argv[argv.index("--set") + 1] = "data.arithmetic.num_validation=2000"
    # SIGINT handled as at a terminal even where the suite was started in the background, whose
    # children inherit SIGINT ignored
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from opefo_nemo.cli.eval import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", code, *argv], env=env, stderr=subprocess.PIPE, text=True
    )
    counts = out / "counts.jsonl"
    deadline = time.monotonic() + 600  # a guard against a hang, not a speed check: start-up
    # (torch, transformers) on a loaded 2-core machine has taken minutes
    while not (counts.is_file() and len(counts.read_text().splitlines()) >= 3):
        assert child.poll() is None and time.monotonic() < deadline, "no counts appeared"
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "Traceback" not in err
    assert "problems counted in" in err and "the same command draws the rest" in err
    lines = counts.read_text().splitlines()
    assert 3 <= len(lines) < 2001
    assert all(json.loads(line)["samples"] == N for line in lines[1:])
