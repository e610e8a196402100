"""report.png's panels: what each one draws, against the curves computed independently."""

from __future__ import annotations

import dataclasses

import matplotlib
import numpy as np
import pytest

from opefo_nemo.report import PANELS, group_curve, group_runs, load_run
from opefo_nemo.report.figure import draw_report
from opefo_nemo.report.panels import missing_metrics

from .run_dirs import PANEL_KEYS, records, run_config, write_run

matplotlib.use("Agg")
STEPS = range(1, 31)


def series(seed: int):
    return lambda key, step: np.sin(0.3 * step + seed + len(key)) + 0.1 * seed


def thick_lines(ax):
    return [line for line in ax.lines if line.get_linewidth() == 2.0]


@pytest.fixture
def groups(tmp_path):
    """grpo_strict × 2 seeds (the second without flow/lambda), opefo × 1 seed."""
    runs = []
    for method, seed in (("grpo_strict", 0), ("grpo_strict", 1), ("opefo", 0)):
        path = tmp_path / f"{method}_{seed}"
        keys = [k for k in PANEL_KEYS if not (seed == 1 and k == "flow/lambda")]
        write_run(path, records(STEPS, series(seed), keys), run_config(method, seed, path))
        runs.append(load_run(path))
    return group_runs(runs)


def test_each_panel_draws_each_groups_mean_curve(groups):
    smooth = 4
    missing = missing_metrics([r for g in groups for r in g.runs])
    fig = draw_report(groups, missing, smooth)
    for ax, panel in zip(fig.axes, PANELS, strict=False):
        lines = thick_lines(ax)
        if panel.clipped_only:  # strict methods only: nothing to draw, and the panel says why
            assert lines == []
            assert "no ratio-clipped method" in ax.texts[0].get_text()
            continue
        width = smooth if panel.smoothed else 1
        expected = [group_curve(group.runs, key, width) for group in groups for key in panel.keys]
        assert len(lines) == len(expected), panel.title
        for line, curve in zip(lines, expected, strict=True):
            assert line.get_xdata().tolist() == curve.steps.tolist()
            np.testing.assert_allclose(line.get_ydata(), curve.mean, rtol=0, atol=1e-12)
        assert ax.get_title() == panel.title
    # λ* of grpo_strict is seed 0's alone (seed 1 never logged it), drawn without a band
    lam = thick_lines(fig.axes[3])[0].get_ydata()
    np.testing.assert_allclose(lam, group_curve(groups[0].runs[:1], "flow/lambda", smooth).mean)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["grpo_strict: mean of 2 seeds (0, 1), min–max band", "opefo (seed 0)"]
    note = fig.texts[-1].get_text()
    assert "grpo_strict seed 1: flow/lambda" in note


def test_bands_span_the_seeds_min_to_max(groups):
    """Without smoothing the band's edges are the per-step minimum and maximum over the seeds."""
    fig = draw_report(groups, {}, 1)
    entropy = fig.axes[0]
    assert len(entropy.collections) == 1  # grpo_strict's: the only group with two seeds
    vertices = entropy.collections[0].get_paths()[0].vertices
    values = np.stack([run.series("entropy/mean")[1] for run in groups[0].runs])
    assert set(vertices[:, 0]) == set(STEPS)
    for step, low, high in zip(STEPS, values.min(0), values.max(0), strict=True):
        edges = vertices[vertices[:, 0] == step][:, 1]
        assert edges.min() == pytest.approx(low, abs=1e-12)
        assert edges.max() == pytest.approx(high, abs=1e-12)


def test_a_measurement_no_run_made_is_not_missing_but_one_some_made_is(tmp_path):
    """Validation (``val/pass@1``) logged by no run: no run is named for it; logged by one run:
    the other is named for it, and every run still lacking a panel's own key is named."""
    keys = [k for k in PANEL_KEYS if k not in ("val/pass@1", "val/pass@largest")]
    runs = []
    for seed in (0, 1):
        path = tmp_path / f"run_{seed}"
        write_run(path, records(STEPS, series(seed), keys), run_config("grpo_strict", seed, path))
        runs.append(load_run(path))
    assert not any("val/pass@1" in absent for absent in missing_metrics(runs).values())
    path = tmp_path / "validated"
    validated = [*keys, "val/pass@1"]
    write_run(path, records(STEPS, series(2), validated), run_config("grpo_strict", 2, path))
    missing = missing_metrics([*runs, load_run(path)])
    assert [run.path.name for run, absent in missing.items() if "val/pass@1" in absent] == [
        "run_0",
        "run_1",
    ]


@pytest.mark.parametrize("count", [2, 8])
def test_legend_of_groups_named_by_their_settings_stays_inside_the_figure(groups, count):
    """Groups named by their settings (``opefo-report`` over variants of one method) have labels
    of well over a hundred characters: the legend wraps them, stays within the figure's width
    and above every panel's title."""
    label = "entropy_neutral (method.entropy_flow.balance=target, "
    named = [
        dataclasses.replace(groups[i % 2], label=f"{label}method.entropy_flow.target_entropy={i})")
        for i in range(count)
    ]
    fig = draw_report(named, {}, 1)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert legend.x0 >= 0 and legend.x1 <= fig.bbox.x1
    assert legend.y1 <= fig.bbox.y1
    assert legend.y0 >= max(ax.get_tightbbox(renderer).y1 for ax in fig.axes)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [t.replace("\n", " ") for t in texts] == [_legend_label_text(g) for g in named]


def _legend_label_text(group):
    seeds = ", ".join(str(s) for s in group.seeds)
    if len(group.runs) == 1:
        return f"{group.label} (seed {seeds})"
    return f"{group.label}: mean of {len(group.runs)} seeds ({seeds}), min–max band"
