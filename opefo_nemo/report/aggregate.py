"""Per-step curves of a group of runs: each run smoothed, then mean and min–max band over seeds
(each step sees different prompts, so single steps are noisy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opefo_nemo.report.runs import Run


def moving_average(values: np.ndarray, width: int) -> np.ndarray:
    """``[n] → [n]``: at position ``i``, the mean of ``values[max(0, i − width + 1) : i + 1]``."""
    if width < 1:
        raise ValueError(f"moving-average width must be >= 1, got {width}")
    totals = np.cumsum(np.concatenate([[0.0], np.asarray(values, dtype=np.float64)]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - width, 0)
    return (totals[ends] - totals[starts]) / (ends - starts)


@dataclass(frozen=True)
class Curve:
    """One metric of one group over steps ``[s]``: ``mean``, ``low``/``high`` (min / max over
    runs of the smoothed series), ``raw`` (mean over runs of the unsmoothed values) and
    ``count`` (runs that logged each step)."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    raw: np.ndarray
    count: np.ndarray


def group_curve(runs: Sequence[Run], key: str, width: int) -> Curve | None:
    """The :class:`Curve` of ``key`` over the runs that logged it; ``None`` if none did. Every
    run's series is first its :func:`moving_average` over ``width`` logged values; then, at each
    step, the mean over the runs that logged that step and the band from their minimum to
    maximum. A run that did not log a step (a shorter run, a non-finite value) is left out of
    that step only."""
    series = [run.series(key) for run in runs]
    series = [(steps, values) for steps, values in series if len(steps)]
    if not series:
        return None
    steps = np.unique(np.concatenate([s for s, _ in series]))
    smooth = np.full((len(series), len(steps)), np.nan)
    raw = np.full_like(smooth, np.nan)
    for row, (run_steps, values) in enumerate(series):
        columns = np.searchsorted(steps, run_steps)
        smooth[row, columns] = moving_average(values, width)
        raw[row, columns] = values
    return Curve(
        steps=steps,
        mean=np.nanmean(smooth, axis=0),
        low=np.nanmin(smooth, axis=0),
        high=np.nanmax(smooth, axis=0),
        raw=np.nanmean(raw, axis=0),
        count=np.sum(~np.isnan(smooth), axis=0),
    )
