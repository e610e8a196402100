"""``opefo-eval calibrate --generator vllm``: the samples come from a vLLM server (the counts
file says so), every problem is counted once with n samples, the held-out file is the band's
problems, and the same command again starts no server and draws nothing."""

from __future__ import annotations

import json
import logging

import pytest

from opefo_nemo.cli import eval as eval_cli

N, PROBLEMS = 8, 6


@pytest.mark.vllm
def test_calibration_on_vllm(demo_model, tmp_path, caplog):
    out = tmp_path / "calibration"
    argv = [
        "calibrate", str(demo_model), "--pool", "data=arithmetic",
        "--set", f"data.arithmetic.num_validation={PROBLEMS}", "--verifier", "arithmetic",
        "--samples", str(N), "--max-new-tokens", "24", "--max-model-len", "64",
        "--band", f"0-{N}", "--generator", "vllm", "--out", str(out),
    ]  # fmt: skip
    assert eval_cli.main(argv) == 0
    lines = (out / "counts.jsonl").read_text().splitlines()
    settings = json.loads(lines[0])["counts"]
    assert (settings["generator"], settings["samples"]) == ("vllm", N)
    counts = [json.loads(line) for line in lines[1:]]
    assert sorted(c["index"] for c in counts) == list(range(PROBLEMS))
    for c in counts:
        assert c["samples"] == N and sum(c["answers"].values()) + c["no_answer"] == N
    kept = [json.loads(line)["id"] for line in (out / "heldout.jsonl").read_text().splitlines()]
    by_index = sorted(counts, key=lambda c: c["index"])
    assert kept == [c["prompt_id"] for c in by_index]  # the band 0-N keeps every problem
    with caplog.at_level(logging.INFO, logger="opefo_nemo.eval"):
        assert eval_cli.main(argv) == 0
    assert f"all {PROBLEMS} problems already counted" in caplog.text
