"""The report's computed series (:mod:`opefo_nemo.report.derived`) on a run written as the
trainer writes it: the cumulative entropy split against sums over a hand-built table of every
batch's entropy under every policy, and the largest logged pass@k."""

from __future__ import annotations

import math
import random

import pytest

from opefo_nemo.core.metrics import EntropyDrift
from opefo_nemo.report import load_run

from .run_dirs import write_run

STEPS = 15


def logged_run(tmp_path, every: int):
    """Records of steps 1..STEPS from ``table[j][s]`` (entropy of step s's batch under the policy
    of step j): ``entropy/mean`` ``table[s][s]``, ``flow/realized`` every ``every`` steps, the
    drift as the trainer's tracker logs it; a step-0 record holds the warm start's validation."""
    rng = random.Random(every)
    table = [[rng.uniform(0.2, 1.5) for _ in range(STEPS + 2)] for _ in range(STEPS + 2)]
    tracker, records = EntropyDrift(), [{"step": 0, "val/pass@1": 0.4, "val/pass@8": 0.9}]
    for s in range(1, STEPS + 1):
        record = {"step": s, "entropy/mean": table[s][s]}
        if s % every == 0:
            record["flow/realized"] = table[s + 1][s] - table[s][s]
        drift = tracker.step(record["entropy/mean"], record.get("flow/realized"))
        if drift is not None:
            record["flow/drift"] = drift
        if s % 5 == 0:
            record.update({f"val/pass@{k}": 0.4 + 0.01 * s + 0.05 * k for k in (1, 2, 4, 8)})
        records.append(record)
    return load_run(write_run(tmp_path / f"every{every}", records, None)), table


@pytest.mark.parametrize("every", [1, 3])
def test_cumulative_split_is_the_sum_over_measured_transitions(tmp_path, every):
    run, table = logged_run(tmp_path, every)
    closed = [s for s in range(2, STEPS + 1) if (s - 1) % every == 0]
    series = {key: run.series(f"cumulative/{key}") for key in ("realized", "drift")}
    series["entropy_change"] = run.series("cumulative/entropy_change")
    expected = {
        "realized": [table[s][s - 1] - table[s - 1][s - 1] for s in closed],
        "drift": [table[s][s] - table[s][s - 1] for s in closed],
        "entropy_change": [table[s][s] - table[s - 1][s - 1] for s in closed],
    }
    bound = 4 * STEPS * 2**-53 * 3.0  # a few fp64 roundings of terms ≤ 3 per transition
    for key, terms in expected.items():
        steps, values = series[key]
        assert steps.tolist() == closed, key
        sums = [math.fsum(terms[: i + 1]) for i in range(len(terms))]
        assert values == pytest.approx(sums, rel=0, abs=bound), key
    total = series["realized"][1] + series["drift"][1]
    assert total == pytest.approx(series["entropy_change"][1], rel=0, abs=bound)
    if every == 1:  # every transition measured: the whole change since step 1
        assert series["entropy_change"][1][-1] == pytest.approx(
            table[STEPS][STEPS] - table[1][1], rel=0, abs=bound
        )


def test_largest_pass_k_starts_at_the_warm_start(tmp_path):
    run, _ = logged_run(tmp_path, 1)
    steps, values = run.series("val/pass@largest")
    assert steps.tolist() == [0, 5, 10, 15]
    assert values.tolist() == [0.9, *(0.4 + 0.01 * s + 0.05 * 8 for s in (5, 10, 15))]
    assert run.steps == STEPS  # the step-0 record is no rollout step
