"""The comparison report of methods trained from the same start: a PNG and a summary table.

Panels (x: rollout step): token-mean entropy, λ*, the entropy flows P and N (spec §3), the net
flow after balancing, reward and response length; thin lines are the per-step values, thick ones
their moving average over ``SMOOTH`` steps (each step sees different prompts, so steps are noisy).
The summary compares the means of the first and of the last ``SMOOTH`` steps.

What to look for: strict GRPO's entropy falls step after step (its net flow is negative), while
OPEFO's balanced flow is zero every step and its entropy does not collapse (on the embedded task
it drifts slightly upward: docs/training.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("token-mean entropy H", ("entropy/mean",), "nats"),
    ("λ* = (N − P) / (N + P)", ("flow/lambda",), ""),
    ("entropy flows: P (solid), N (dashed)", ("flow/pos", "flow/neg"), "Σ ΔH"),
    ("net flow after balancing (1+λ)P − (1−λ)N", ("flow/net_after_balance",), "Σ ΔH"),
    ("reward (mean)", ("reward/mean",), ""),
    ("response length (tokens)", ("response/length_mean",), "tokens"),
)
STYLES = ("-", "--", ":")
SMOOTH = 10


def moving_average(values: Sequence[float], width: int = SMOOTH) -> list[float]:
    """Mean of the last ``min(width, i + 1)`` values at each position ``i``."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - width] if i >= width else 0.0)
        out.append(total / min(width, i + 1))
    return out


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [float(p[1]) for p in points]


def summary_rows(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, float | str]]:
    """Per method: entropy and reward means over the first and the last ``SMOOTH`` steps, the
    mean |λ*| and the summed ``flow/realized`` (when logged)."""
    rows = []
    for name, records in runs.items():
        _, entropy = _series(records, "entropy/mean")
        _, reward = _series(records, "reward/mean")
        _, lam = _series(records, "flow/lambda")
        _, realized = _series(records, "flow/realized")
        width = min(SMOOTH, len(entropy))
        first, last = sum(entropy[:width]) / width, sum(entropy[-width:]) / width
        rows.append(
            {
                "method": name,
                "entropy_first": first,
                "entropy_last": last,
                "entropy_change": last - first,
                "reward_first": sum(reward[:width]) / width,
                "reward_last": sum(reward[-width:]) / width,
                "mean_abs_lambda": sum(abs(x) for x in lam) / len(lam),
                "realized_sum": sum(realized),
            }
        )
    return rows


def write_comparison(runs: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: Path) -> Path:
    """``report.png`` and ``summary.md`` under ``out_dir``; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, keys, unit) in zip(axes.flat, PANELS, strict=True):
        for i, (name, records) in enumerate(runs.items()):
            for j, key in enumerate(keys):
                steps, values = _series(records, key)
                color = colors[i % len(colors)]
                label = name if j == 0 else None
                ax.plot(steps, values, STYLES[j], color=color, lw=0.8, alpha=0.4)
                smooth = moving_average(values)
                ax.plot(steps, smooth, STYLES[j], color=color, label=label, lw=2.2)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("rollout step")
        if unit:
            ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if keys[0] in ("flow/lambda", "flow/net_after_balance"):
            ax.axhline(0.0, color="grey", lw=0.8)
    axes.flat[0].legend(fontsize=10)
    fig.suptitle(
        "Same warm start, same prompts and seeds: "
        + " vs ".join(runs)
        + f"  (thin: per step; thick: {SMOOTH}-step moving average)",
        fontsize=13,
    )
    png = out_dir / "report.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    rows = summary_rows(runs)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [v if isinstance(v, str) else f"{v:.4f}" for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return png
