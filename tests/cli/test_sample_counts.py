"""The bookkeeping of a draw: row seeds of a calibration and of a comparison never meet, problems
go to forwards in runs of consecutive indices, and progress and cost are reported."""

from __future__ import annotations

import logging

from opefo_nemo.cli.sample_counts import (
    SEED_SPAN,
    DrawCost,
    Progress,
    chunks,
    sample_seed,
)
from opefo_nemo.eval.counts import ProblemCount


def test_calibration_and_comparison_row_seeds_never_meet():
    # a draw uses base + i·n + j for fewer than 2^29 samples: its seeds lie in [base, base + 2^29)
    span = SEED_SPAN // 2
    calibrations = [sample_seed("calibrate", seed) for seed in range(300)]
    comparisons = [sample_seed("compare", seed) for seed in range(300)]
    assert all(0 <= b <= SEED_SPAN - span for b in calibrations)
    assert all(SEED_SPAN <= b <= 2 * SEED_SPAN - span for b in comparisons)
    assert 2 * SEED_SPAN <= 2**32  # vLLM takes seeds below 2^32
    assert len(set(calibrations)) == 300  # another --seed, other samples
    assert sample_seed("compare", 5) == sample_seed("compare", 5)


def test_problems_go_in_runs_of_consecutive_indices():
    ids = [f"p{i}" for i in range(8)]
    prompts = [[i + 1] for i in range(8)]
    truths = [str(i) for i in range(8)]
    work = chunks([0, 1, 2, 4, 5, 6, 7], ids, prompts, truths, 3)
    assert [(c.start, c.prompt_ids) for c in work] == [
        (0, ["p0", "p1", "p2"]),
        (4, ["p4", "p5", "p6"]),
        (7, ["p7"]),
    ]
    assert work[1].prompts == [[5], [6], [7]] and work[1].truths == ["4", "5", "6"]


def test_progress_reports_the_last_problem_and_the_cost(caplog):
    progress = Progress("calibrate", total=3, done=1, n=4)
    progress.started()
    with caplog.at_level(logging.INFO, logger="opefo_nemo.eval"):
        progress.add(
            [ProblemCount(1, "p1", 4, 1, tokens=10), ProblemCount(2, "p2", 4, 0, tokens=6)]
        )
    assert "calibrate: 3/3 problems, 12/12 samples" in caplog.text
    cost = progress.cost()
    assert (cost.samples, cost.tokens) == (8, 16)
    text = DrawCost(8, 16, 2.0, 1.5).describe()
    assert text == "8 samples (16 tokens) in 2.0 s, 4.00 samples/s, after 1.5 s of start-up"
