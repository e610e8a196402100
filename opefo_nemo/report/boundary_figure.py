"""``boundary.png``: the boundary comparison of ``eval/boundary_report.py`` in one figure: every
model's pass@k curve over k (log scale) with its bootstrap band, and Δ(k) of each model against the
first with its paired interval (docs/boundary.md, "Reading the comparison").
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DPI = 100


def draw_boundary(report: Mapping[str, Any], caption: str = ""):
    """The matplotlib ``Figure`` of ``report``: left, pass@k of each model (line) and its 95 %
    band (shaded); right, Δ(k) of each later model against the first (points, with the paired
    interval as error bars) and the zero line. ``caption`` goes under the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = report["ks"]
    confidence = round(100 * report["confidence"])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (curves, deltas) = plt.subplots(1, 2, figsize=(12.5, 4.8))
    for index, (label, model) in enumerate(report["models"].items()):
        points = [model["pass_at_k"][str(k)] for k in ks]
        color = colors[index % len(colors)]
        curves.plot(ks, [p["value"] for p in points], "o-", color=color, lw=2, ms=4, label=label)
        low, high = [p["low"] for p in points], [p["high"] for p in points]
        curves.fill_between(ks, low, high, color=color, alpha=0.2, lw=0)
    curves.set_title(f"pass@k, {report['problems']} problems × {report['samples']} samples")
    curves.set_ylabel(f"pass@k (band: {confidence} % bootstrap interval)")
    for index, pair in enumerate(report["comparisons"], start=1):
        color = colors[index % len(colors)]
        values = [pair["delta"][str(k)] for k in ks]
        centre = [v["value"] for v in values]
        below = [v["value"] - v["low"] for v in values]
        above = [v["high"] - v["value"] for v in values]
        deltas.errorbar(
            ks, centre, yerr=[below, above], fmt="o-", color=color, capsize=3, lw=1.5, ms=4,
            label=f"{pair['b']} − {pair['a']}",
        )  # fmt: skip
    deltas.axhline(0.0, color="grey", lw=0.8, zorder=0)
    deltas.set_title("Δ(k) against the first model")
    deltas.set_ylabel(f"Δ pass@k ({confidence} % paired bootstrap interval)")
    for ax in (curves, deltas):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="best", framealpha=0.7)
    bottom = 0.0
    if caption:
        fig.text(
            0.5, 0.01, textwrap.shorten(caption, 200), ha="center", fontsize=9, color="dimgrey"
        )
        bottom = 0.05
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def write_boundary_figure(report: Mapping[str, Any], out_dir: Path, caption: str = "") -> Path:
    """:func:`draw_boundary` saved as ``out_dir/boundary.png``; returns its path."""
    import matplotlib.pyplot as plt

    fig = draw_boundary(report, caption)
    path = out_dir / "boundary.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
