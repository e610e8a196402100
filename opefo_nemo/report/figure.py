"""``report.png``: the panels of :mod:`.panels`, one colour per group (x: rollout step;
docs/training.md, "Comparing methods and seeds").
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from opefo_nemo.report.aggregate import group_curve
from opefo_nemo.report.panels import PANELS, STYLES, Panel, shown_runs
from opefo_nemo.report.runs import Group, Run

COLUMNS = 4
DPI = 100


#: Characters per line of a legend label: three columns of this width fit the figure's width at
#: the legend's font size; a longer label (a group named by its settings) wraps onto more lines.
LEGEND_WIDTH = 62


def _legend_label(group: Group) -> str:
    seeds = ", ".join("?" if s is None else str(s) for s in group.seeds)
    if len(group.runs) == 1:
        label = group.label if group.seeds[0] is None else f"{group.label} (seed {seeds})"
    else:
        label = f"{group.label}: mean of {len(group.runs)} seeds ({seeds}), min–max band"
    return textwrap.fill(label, LEGEND_WIDTH, break_on_hyphens=False)


def _caption(groups: Sequence[Group], smooth: int) -> str:
    average = f"{smooth}-step moving average" if smooth > 1 else "per-step values (no smoothing)"
    if all(len(group.runs) == 1 for group in groups):
        return f"Thick: each run's {average}; faint: per-step values"
    return (
        f"Thick: mean over seeds of each run's {average}; faint: per-step values "
        "(mean over seeds); band: min–max over seeds"
    )


def _draw_panel(ax, panel: Panel, groups: Sequence[Group], colors: Sequence[str], smooth: int):
    drawn = False
    for index, group in enumerate(groups):
        color = colors[index % len(colors)]
        runs = shown_runs(panel, group.runs)
        for key, style in zip(panel.keys, STYLES, strict=False):
            curve = group_curve(runs, key, smooth if panel.smoothed else 1)
            if curve is None:
                continue
            drawn = True
            ax.plot(curve.steps, curve.raw, style, color=color, lw=0.7, alpha=0.35)
            ax.plot(curve.steps, curve.mean, style, color=color, lw=2.0)
            if curve.count.max() > 1:
                ax.fill_between(curve.steps, curve.low, curve.high, color=color, alpha=0.18, lw=0)
    ax.set_title(panel.title, fontsize=10.5)
    ax.set_xlabel("rollout step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if panel.zero_line and drawn:
        ax.axhline(0.0, color="grey", lw=0.8, zorder=0)
    if panel.key_names and drawn:
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], ls=style, color="black", lw=1.5)
            for style in STYLES[: len(panel.key_names)]
        ]
        ax.legend(handles, panel.key_names, fontsize=8.5, loc="best", framealpha=0.7)
    if not drawn:
        reason = (
            "no ratio-clipped method among these runs\n(strict methods clip nothing)"
            if panel.clipped_only
            else "no run logged " + ", ".join(panel.logged_keys)
        )
        ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("")
        ax.set_ylabel("")


def draw_report(groups: Sequence[Group], missing: dict[Run, list[str]], smooth: int):
    """The report's matplotlib ``Figure``: every panel for ``groups``; the runs of ``missing``
    (run → metrics it never logged) are named under the panels. Per group and metric: a faint
    line of the per-step values (mean over seeds), a thick line of the mean over seeds of each
    run's ``smooth``-step trailing moving average, and, for several seeds, a band from their
    minimum to their maximum (:mod:`.aggregate`). A panel's second metric is dashed, a third
    dotted; validation and running sums are unsmoothed; a panel no run can show says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = -(-len(PANELS) // COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(4.6 * COLUMNS, 3.9 * rows + 1.3))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes.flat, PANELS, strict=False):
        _draw_panel(ax, panel, groups, colors, smooth)
    for ax in axes.flat[len(PANELS) :]:
        fig.delaxes(ax)
    handles = [Line2D([], [], color=colors[i % len(colors)], lw=2.5) for i in range(len(groups))]
    labels = [_legend_label(g) for g in groups]
    columns = min(len(groups), 3)
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=columns,
        fontsize=11,
        frameon=False,
        bbox_to_anchor=(0.5, 0.955),
    )
    fig.suptitle(_caption(groups, smooth), fontsize=12, y=0.995)
    bottom = 0.0
    if missing:
        lacking = "; ".join(f"{run.describe()}: {', '.join(keys)}" for run, keys in missing.items())
        note = f"Not logged, so left out of those panels (summary.md lists them): {lacking}"
        fig.text(0.5, 0.008, textwrap.shorten(note, 230), ha="center", fontsize=9, color="dimgrey")
        bottom = 0.03
    # matplotlib fills a multi-column legend column by column: row r holds labels r, r + rows, ...
    legend_rows = -(-len(labels) // columns)
    lines = sum(
        max(label.count("\n") + 1 for label in labels[r::legend_rows]) for r in range(legend_rows)
    )
    fig.tight_layout(rect=(0, bottom, 1, 0.93 - 0.012 * (lines - 1)))
    return fig


def write_figure(
    groups: Sequence[Group], missing: dict[Run, list[str]], out_dir: Path, smooth: int
) -> Path:
    """:func:`draw_report` saved as ``out_dir/report.png``; returns its path."""
    import matplotlib.pyplot as plt

    fig = draw_report(groups, missing, smooth)
    path = out_dir / "report.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
