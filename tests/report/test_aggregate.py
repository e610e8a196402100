"""Moving averages and the across-seed curves against float64 loops written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opefo_nemo.report import group_curve, load_run, moving_average

from .run_dirs import records, write_run

EPS = np.finfo(np.float64).eps


def window_mean(values: list[float], i: int, width: int) -> float:
    window = values[max(0, i - width + 1) : i + 1]
    return math.fsum(window) / len(window)


@pytest.mark.parametrize("width", [1, 3, 10, 60])
def test_moving_average_is_the_trailing_window_mean(width):
    rng = np.random.default_rng(width)
    values = list(rng.normal(2.0, 1.5, size=50))
    expected = [window_mean(values, i, width) for i in range(len(values))]
    # A running sum: each total carries at most n·eps·Σ|v| of round-off, a window mean twice that.
    tolerance = 2 * len(values) * EPS * sum(abs(v) for v in values)
    assert moving_average(np.array(values), width) == pytest.approx(expected, rel=0, abs=tolerance)


def test_moving_average_refuses_a_width_below_one():
    with pytest.raises(ValueError, match="width"):
        moving_average(np.ones(3), 0)


def test_group_curve_is_mean_and_min_max_of_each_runs_smoothed_series(tmp_path):
    """Three seeds: one shorter, one with a non-finite (null) value at step 5. Each run's logged
    values are smoothed, then at every step mean / min / max go over the runs that logged it."""
    rng = np.random.default_rng(0)
    table = {run: {s: float(rng.normal(0.5, 0.2)) for s in range(1, 13)} for run in "abc"}
    steps = {"a": range(1, 13), "b": range(1, 9), "c": range(1, 13)}
    runs = []
    for name in "abc":

        def value(key, step, name=name):
            return None if (name == "c" and step == 5) else table[name][step]

        path = write_run(tmp_path / name, records(steps[name], value, ["entropy/mean"]), None)
        runs.append(load_run(path))
    width = 3

    smoothed = {}
    for name in "abc":
        logged = [s for s in steps[name] if not (name == "c" and s == 5)]
        values = [table[name][s] for s in logged]
        smoothed[name] = {s: window_mean(values, i, width) for i, s in enumerate(logged)}

    curve = group_curve(runs, "entropy/mean", width)
    assert curve.steps.tolist() == list(range(1, 13))
    tolerance = 64 * EPS  # values below 1, sums of at most 12 of them
    for column, step in enumerate(curve.steps):
        present = [n for n in "abc" if step in smoothed[n]]
        assert curve.count[column] == len(present)
        here = [smoothed[n][step] for n in present]
        assert curve.mean[column] == pytest.approx(math.fsum(here) / len(here), abs=tolerance)
        assert curve.low[column] == pytest.approx(min(here), abs=tolerance)
        assert curve.high[column] == pytest.approx(max(here), abs=tolerance)
        raw = [table[n][step] for n in present]
        assert curve.raw[column] == pytest.approx(math.fsum(raw) / len(raw), abs=tolerance)
    assert curve.count.tolist() == [3] * 4 + [2] + [3] * 3 + [2] * 4


def test_group_curve_of_a_metric_no_run_logged_is_none(tmp_path):
    run = load_run(write_run(tmp_path / "a", records(range(1, 4), lambda k, s: 1.0), None))
    assert group_curve([run], "fidelity/kl", 5) is None
