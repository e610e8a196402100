"""``boundary.png``: the curves and bands it draws are the report's numbers."""

from __future__ import annotations

import numpy as np

from opefo_nemo.eval.boundary_report import boundary_report
from opefo_nemo.eval.counts import ProblemCount
from opefo_nemo.report.boundary_figure import draw_boundary, write_boundary_figure


def _report():
    correct = {"base": [1, 0, 3, 8, 2], "trained": [4, 0, 0, 8, 8]}
    counts = {
        label: [ProblemCount(i, f"p{i}", 8, c) for i, c in enumerate(values)]
        for label, values in correct.items()
    }
    return boundary_report(counts, [1, 2, 4], 200, 0)


def test_the_figure_draws_the_reports_curves_bands_and_deltas(tmp_path):
    report = _report()
    fig = draw_boundary(report, caption="h.jsonl, seed 0; 2026-01-01, a CPU")
    curves, deltas = fig.axes
    for line, (label, model) in zip(curves.lines, report["models"].items(), strict=True):
        assert line.get_label() == label
        assert list(line.get_xdata()) == [1, 2, 4]
        want = [model["pass_at_k"][str(k)]["value"] for k in (1, 2, 4)]
        assert list(line.get_ydata()) == want
    bands = curves.collections  # fill_between: one band a model, from low to high
    assert len(bands) == 2
    base_band = bands[0].get_paths()[0].vertices
    lows = [report["models"]["base"]["pass_at_k"][str(k)]["low"] for k in (1, 2, 4)]
    assert np.isin(lows, base_band[:, 1]).all()
    (pair,) = report["comparisons"]
    (errorbar,) = deltas.containers
    assert errorbar.get_label() == "trained − base"
    want = [pair["delta"][str(k)]["value"] for k in (1, 2, 4)]
    assert list(errorbar.lines[0].get_ydata()) == want
    path = write_boundary_figure(report, tmp_path, "caption")
    assert path == tmp_path / "boundary.png" and path.read_bytes()[:4] == b"\x89PNG"
